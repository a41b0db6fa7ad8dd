// Package averaging averages model parameters (or gradients) among peers
// over p2p.Transport: a bandwidth-aware group all-reduce (reduce-scatter plus
// all-gather in chunks, with optional fp16 or 8-bit compression), the
// WAGMA-SGD schedule (butterfly groups from rotating digit windows,
// wait-avoiding activation, a staleness bound of τ rounds enforced by a
// synchronous global average), the synchronous all-reduce SGD and local SGD
// baselines on the same code path, and Moshpit-style decentralized
// matchmaking through the DHT with late joining.
//
// Pure pieces (Partition, ButterflyGroup, the message codecs) are plain
// functions; Averager does the I/O. Every message received is size-bounded
// and validated, and every wait ends at a deadline: a member that dies or
// stalls mid-reduction is dropped and the others finish with the mean over
// the members that did contribute. See docs/averaging.md.
package averaging
