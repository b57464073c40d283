package apiclient

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestInProcess: answers come back with their status and headers, the
// body streams as the handler writes it, a handler that breaks off shows
// as a failed read, and upgrades are refused.
func TestInProcess(t *testing.T) {
	next := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Test", r.Header.Get("Authorization"))
		w.WriteHeader(http.StatusTeapot)
		io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		<-next // the caller has read the first line before the second is written
		io.WriteString(w, "second\n")
	})
	mux.HandleFunc("/abort", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "partial")
		panic(http.ErrAbortHandler)
	})
	hc := InProcess(mux)

	req, _ := http.NewRequest("GET", "http://in-process/stream", nil)
	req.Header.Set("Authorization", "Bearer k")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusTeapot || resp.Header.Get("X-Test") != "Bearer k" {
		t.Fatalf("status %d, header %q", resp.StatusCode, resp.Header.Get("X-Test"))
	}
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); line != "first\n" || err != nil {
		t.Fatalf("first line %q, %v", line, err)
	}
	close(next)
	if rest, err := io.ReadAll(br); string(rest) != "second\n" || err != nil {
		t.Fatalf("rest %q, %v", rest, err)
	}
	resp.Body.Close()

	resp, err = hc.Get("http://in-process/abort")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(resp.Body); err == nil {
		t.Fatalf("an aborted answer read whole: %q", b)
	}
	resp.Body.Close()

	resp, err = hc.Get("http://in-process/nothing")
	if err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unrouted: %v, %v", resp, err)
	}
	resp.Body.Close()

	req, _ = http.NewRequest("GET", "http://in-process/stream", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", TunnelProtocol)
	if _, err := hc.Do(req); err == nil || !strings.Contains(err.Error(), "upgrade") {
		t.Fatalf("an upgrade: %v", err)
	}
}
