// Package text provides the data of Skyhive's language models: an English
// corpus (the Collaborative International Dictionary of English as Debian's
// dict-gcide package installs it, cleaned to plain prose), readers for the
// corpora users bring (plain text files and flat token files as nanoGPT-style
// pipelines write them), a byte-level BPE tokenizer, a deterministic
// train/validation split by contiguous blocks, seeded batching of
// next-token-prediction windows, and a count-based bigram model whose
// perplexity is the baseline a trained language model must beat.
//
// Everything read from disk is untrusted: sizes are bounded before
// allocation, token ids are checked against the vocabulary, and a tokenizer
// file is validated completely before use. All randomness comes from
// explicitly seeded math/rand/v2 generators.
package text
