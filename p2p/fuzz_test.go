package p2p

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// FuzzChunkReader feeds arbitrary bytes to the stream-frame reader: it must
// never panic, never return more payload than the total limit, and end with
// a definite error.
func FuzzChunkReader(f *testing.F) {
	var ok bytes.Buffer
	cw := NewChunkWriter(&ok, 4)
	cw.Write([]byte("hello, world"))
	cw.Close()
	f.Add(ok.Bytes())
	var bad bytes.Buffer
	cw = NewChunkWriter(&bad, 8)
	cw.Write([]byte("abc"))
	cw.Flush()
	cw.Abort("boom")
	f.Add(bad.Bytes())
	f.Add([]byte{frameData, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{frameError, 0, 0, 0x10, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		const limit = 64
		cr := NewChunkReader(bytes.NewReader(b), limit)
		got, err := io.ReadAll(cr)
		if len(got) > limit {
			t.Fatalf("read %d bytes over the limit", len(got))
		}
		if len(got) > len(b) {
			t.Fatalf("read %d payload bytes from %d input bytes", len(got), len(b))
		}
		if err == nil {
			// A clean end means an end frame was present.
			if !bytes.Contains(b, []byte{frameEnd, 0, 0, 0, 0}) {
				t.Fatal("clean end without an end frame")
			}
		}
		var re *RemoteError
		if errors.As(err, &re) && len(re.Msg) > maxErrorBytes {
			t.Fatalf("error message of %d bytes", len(re.Msg))
		}
	})
}

// FuzzReadResponse feeds arbitrary bytes to the Call response parser.
func FuzzReadResponse(f *testing.F) {
	f.Add([]byte{statusOK, 0, 0, 0, 3, 'a', 'b', 'c'})
	f.Add([]byte{statusError, 0, 0, 0, 2, 'n', 'o'})
	f.Add([]byte{statusOK, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{7})
	h := &Host{cfg: Config{MaxMessageBytes: 1 << 10}.withDefaults()}
	f.Fuzz(func(t *testing.T, b []byte) {
		resp, err := h.readResponse(bytes.NewReader(b), "", "/fuzz")
		if err == nil && len(resp) > 1<<10 {
			t.Fatalf("accepted %d bytes over the limit", len(resp))
		}
		if err == nil && len(resp)+5 > len(b) {
			t.Fatalf("response of %d bytes from %d input bytes", len(resp), len(b))
		}
	})
}

// TestChunkWriterFraming checks the frame layout byte for byte and that
// large writes pass through without buffering.
func TestChunkWriterFraming(t *testing.T) {
	var out bytes.Buffer
	cw := NewChunkWriter(&out, 4)
	cw.Write([]byte("ab"))
	cw.Write([]byte("cdefghij")) // fills "abcd", then "efgh" directly... buffered path first
	if err := cw.Close(); err != nil {
		t.Fatal(err)
	}
	want := []byte{
		frameData, 0, 0, 0, 4, 'a', 'b', 'c', 'd',
		frameData, 0, 0, 0, 4, 'e', 'f', 'g', 'h',
		frameData, 0, 0, 0, 2, 'i', 'j',
		frameEnd, 0, 0, 0, 0,
	}
	if !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("framed %v\nwant   %v", out.Bytes(), want)
	}
	if _, err := cw.Write([]byte("x")); err == nil {
		t.Fatal("write after Close succeeded")
	}
	got, err := io.ReadAll(NewChunkReader(&out, 0))
	if err != nil || string(got) != "abcdefghij" {
		t.Fatalf("read back %q, %v", got, err)
	}
}
