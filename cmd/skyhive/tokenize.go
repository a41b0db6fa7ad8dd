package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/skyhive/skyhive/train"
)

func newTokenizeCmd() *cobra.Command {
	var (
		lm        lmDataFlags
		data, out string
		ck        string
		seed      uint64
	)
	cmd := &cobra.Command{
		Use:   "tokenize --out DIR",
		Short: "Write a language model's training and validation tokens for another trainer (PyTorch)",
		Long: "Tokenize and split text data exactly as `skyhive train` and `skyhive peer` do for a language\n" +
			"model (a byte-level BPE of --vocab tokens trained on the text, or --checkpoint's tokenizer; a\n" +
			"tenth of the tokens held out for validation with --seed), and write them to --out:\n" +
			"train.bin and val.bin (little-endian uint16 ids, uint32 above 65,536 tokens, as nanoGPT\n" +
			"reads them) and tokens.json (the vocabulary, the tokenizer and the data signature a\n" +
			"PyTorch twin needs to average with Go peers of the same data). See docs/pytorch.md.",
		Example: "  skyhive tokenize --data gcide --vocab 1024 --out gcide-tokens\n" +
			"  skyhive tokenize --checkpoint lm.safetensors --out val-tokens   # the checkpoint's tokenizer",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return fmt.Errorf("--out is required: the directory to write train.bin, val.bin and tokens.json to")
			}
			o := train.TokenizeOptions{Vocab: lm.vocab, Seed: seed, Log: cmd.ErrOrStderr()}
			if ck != "" {
				m, err := train.LoadLM(ck)
				if err != nil {
					return err
				}
				if m.Tokenizer == nil {
					return fmt.Errorf("checkpoint %s holds no tokenizer (it was trained on %s, token data)", ck, m.Data)
				}
				o.Tokenizer = m.Tokenizer
				if !cmd.Flags().Changed("data") {
					data = m.Data
				}
			}
			vocab := 0
			if cmd.Flags().Changed("vocab") {
				vocab = lm.vocab
			}
			corpus, err := train.LoadCorpus(data, lm.corpusBytes, lm.tokenWidth, vocab)
			if err != nil {
				return err
			}
			e, err := train.ExportTokens(corpus, o, out)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %d training and %d validation tokens, vocabulary %d, data signature %s, written to %s\n",
				e.Data, e.TrainTokens, e.ValTokens, e.Vocab, e.Signature, out)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&data, "data", "gcide", "text data: "+train.TextDataUsage)
	fl.StringVar(&out, "out", "", "directory to write train.bin, val.bin and tokens.json to (created if missing)")
	fl.StringVar(&ck, "checkpoint", "", "a language-model checkpoint of skyhive train: encode with its tokenizer (and its --data, unless given)")
	fl.Uint64Var(&seed, "seed", 1, "seed of the training/validation split (the --seed of the run to match)")
	fl.Int64Var(&lm.corpusBytes, "corpus-bytes", train.DefaultCorpusBytes, "bytes of the data to read (of GCIDE, decompressed)")
	fl.IntVar(&lm.vocab, "vocab", train.DefaultVocab, "BPE vocabulary trained on text; with tokens:PATH, the file's vocabulary (required)")
	fl.IntVar(&lm.tokenWidth, "token-width", 2, "bytes per id of a tokens:PATH file (2: uint16, 4: uint32)")
	return cmd
}
