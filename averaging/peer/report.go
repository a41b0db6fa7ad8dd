package peer

import (
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"

	"github.com/skyhive/skyhive/p2p"
)

// Report writes each peer's result and the mean over the peers as
// sentences: validation perplexity for language models, test accuracy
// for image classifiers.
func (l Launched) Report(w io.Writer) {
	if l.LM {
		for i, r := range l.Peers {
			fmt.Fprintf(w, "  peer %d (%s): validation perplexity %.2f (unigram %.2f), %d steps, %d rounds, %.1f MB sent\n",
				i, p2p.ShortID(r.Peer), r.ValPerplexity, r.UnigramPerplexity, r.Steps, r.Rounds, float64(r.BytesSent)/1e6)
		}
		fmt.Fprintf(w, "%s: mean validation perplexity of %d peers %.2f (logs: %s)\n",
			l.Algo, len(l.Peers), l.MeanValPerplexity, filepath.Clean(l.Dir))
		return
	}
	for i, r := range l.Peers {
		fmt.Fprintf(w, "  peer %d (%s): test accuracy %.2f%%, %d steps, %d rounds, %.1f MB sent\n",
			i, p2p.ShortID(r.Peer), 100*r.TestAccuracy, r.Steps, r.Rounds, float64(r.BytesSent)/1e6)
	}
	fmt.Fprintf(w, "%s: mean test accuracy of %d peers %.2f%% (logs: %s)\n",
		l.Algo, len(l.Peers), 100*l.MeanAccuracy, filepath.Clean(l.Dir))
}

// Report writes the peer's result: one JSON line in the benchmark
// protocol (asJSON), or a sentence.
func (r Result) Report(w io.Writer, asJSON bool) error {
	if r.Model != "" {
		return r.reportLM(w, asJSON)
	}
	if !asJSON {
		fmt.Fprintf(w, "peer %s: test accuracy %.2f%% after %d steps, %d rounds, %.0fs; %.1f MB sent\n",
			p2p.ShortID(r.Peer), 100*r.TestAccuracy, r.Steps, r.Rounds, r.Seconds, float64(r.BytesSent)/1e6)
		return nil
	}
	line := map[string]any{
		"suite": "peer", "case": r.Algo, "metric": "test_accuracy", "value": r.TestAccuracy, "unit": "fraction",
		"peer": r.Peer, "test_accuracy": r.TestAccuracy, "test_loss": r.TestLoss, "first_accuracy": r.FirstAccuracy,
		"steps": r.Steps, "rounds": r.Rounds, "samples": r.Samples, "bytes_sent": r.BytesSent,
		"bytes_received": r.BytesReceived, "seconds": r.Seconds, "groups": r.Groups, "failures": r.Failures, "max_step_seconds": r.MaxStepSeconds,
		"joined_from": r.Joined, "resumed": r.Resumed, "epoch": r.Epoch, "swarm_peers": r.SwarmPeers,
	}
	return json.NewEncoder(w).Encode(line)
}

// reportLM is Report for a language model.
func (r Result) reportLM(w io.Writer, asJSON bool) error {
	if !asJSON {
		fmt.Fprintf(w, "peer %s: validation perplexity %.2f (unigram %.2f) of %s after %d steps, %d rounds, %.0fs; %.1f MB sent\n",
			p2p.ShortID(r.Peer), r.ValPerplexity, r.UnigramPerplexity, r.Model, r.Steps, r.Rounds, r.Seconds, float64(r.BytesSent)/1e6)
		return nil
	}
	line := map[string]any{
		"suite": "peer", "case": r.Algo, "metric": "val_perplexity", "value": r.ValPerplexity, "unit": "perplexity",
		"peer": r.Peer, "model": r.Model, "val_loss": r.ValLoss, "val_perplexity": r.ValPerplexity,
		"first_perplexity": r.FirstPerplexity, "unigram_perplexity": r.UnigramPerplexity, "eval_tokens": r.EvalTokens,
		"steps": r.Steps, "rounds": r.Rounds, "samples": r.Samples, "bytes_sent": r.BytesSent,
		"bytes_received": r.BytesReceived, "seconds": r.Seconds, "groups": r.Groups, "failures": r.Failures, "max_step_seconds": r.MaxStepSeconds,
		"joined_from": r.Joined, "resumed": r.Resumed, "epoch": r.Epoch, "swarm_peers": r.SwarmPeers,
	}
	return json.NewEncoder(w).Encode(line)
}
