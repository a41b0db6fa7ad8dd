// Package data provides the training data of Skyhive: a validating reader
// for Fashion-MNIST IDX files (gzipped or raw, as Debian's
// dataset-fashion-mnist package installs them), a Dataset type with seeded
// per-epoch shuffling, batching, sharding for data-parallel peers and
// splitting, and synthetic sources (token sequences for BERT-style timing
// runs, Gaussian blobs for small learnable tasks).
//
// Files read from disk are untrusted: the IDX decoder checks magic numbers,
// bounds header dimensions before allocating and rejects truncated or
// trailing data. All randomness comes from explicitly seeded math/rand/v2
// generators.
package data
