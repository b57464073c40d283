package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/template"
)

// runCodeTimeout bounds one execution of run_code_rtt, and the first
// start of a language's interpreter.
const runCodeTimeout = 3 * time.Minute

// A runCodeLang is a language of run_code_rtt: the trivial code it runs
// and the text its run must give (its main result's, or its stdout).
type runCodeLang struct {
	name, code, want string
}

// runCodeBaseline is run_code_rtt's baseline: Python on its Jupyter
// kernel, the language E2B's code interpreter started with.
var runCodeBaseline = runCodeLang{"python", "1 + 1", "2"}

// runCodeLangs are the languages run_code_rtt compares with Python, the
// first as the headline, the others as variants.
var runCodeLangs = []runCodeLang{
	{"javascript", "1 + 1", "2"},
	{"typescript", "1 + 1", "2"},
	{"bash", "echo 2", "2\n"},
	{"r", "1 + 1", "[1] 2"},
}

// codeInterpreter is a client of the code interpreter's server in one
// sandbox, on its guest port through the sandbox's gateway.
type codeInterpreter struct {
	client *http.Client
	base   string
}

func newCodeInterpreter(sb *sandbox.Sandbox) *codeInterpreter {
	port := uint16(template.CodeInterpreterPort)
	return &codeInterpreter{
		client: &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return sb.DialGuest(ctx, port)
			},
		}},
		base: "http://" + net.JoinHostPort("guest", strconv.Itoa(int(port))),
	}
}

// post sends a JSON body and returns the answer's body, which must be 200.
func (c *codeInterpreter) post(ctx context.Context, path string, body any) (io.ReadCloser, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("POST %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		resp.Body.Close()
		return nil, fmt.Errorf("POST %s: %s: %s", path, resp.Status, bytes.TrimSpace(msg))
	}
	return resp.Body, nil
}

// newContext makes a code context of language and returns its ID.
func (c *codeInterpreter) newContext(ctx context.Context, language string) (string, error) {
	body, err := c.post(ctx, "/contexts", map[string]string{"language": language})
	if err != nil {
		return "", err
	}
	defer body.Close()
	var out struct {
		ID string `json:"id"`
	}
	if err := json.NewDecoder(body).Decode(&out); err != nil || out.ID == "" {
		return "", fmt.Errorf("new %s context: answer without an id (%v)", language, err)
	}
	return out.ID, nil
}

// run executes code in a context, reading its stream to the end, and
// returns the text it gave: its main result's, else its stdout. An error
// in the stream is an error.
func (c *codeInterpreter) run(ctx context.Context, contextID, code string) (string, error) {
	body, err := c.post(ctx, "/execute", map[string]string{"code": code, "context_id": contextID})
	if err != nil {
		return "", err
	}
	defer body.Close()
	var text, stdout string
	haveText := false
	sc := bufio.NewScanner(body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var line struct {
			Type   string `json:"type"`
			Text   string `json:"text"`
			Main   bool   `json:"is_main_result"`
			Name   string `json:"name"`
			Value  string `json:"value"`
			Traced string `json:"traceback"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return "", fmt.Errorf("execute: line %q: %w", clip(sc.Text()), err)
		}
		switch line.Type {
		case "result":
			if line.Main && !haveText {
				text, haveText = line.Text, true
			}
		case "stdout":
			stdout += line.Text
		case "error":
			return "", fmt.Errorf("execute %q: %s: %s", code, line.Name, clip(line.Value))
		case "end_of_execution":
			if haveText {
				return text, nil
			}
			return stdout, nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("execute: %w", err)
	}
	return "", errors.New("execute: the stream ended without end_of_execution")
}

// runCodeRTT measures, in one sandbox of the code-interpreter template,
// the round trip of running a trivial expression in each language's
// context over the server's HTTP API, against the same in a Python
// context, in rounds that take every language in turn.
func (r *runner) runCodeRTT(ctx context.Context) (_ Result, err error) {
	tpl, err := r.rt.Templates().Resolve(warmTemplateRef)
	if err != nil {
		return Result{}, fmt.Errorf("%s needs template %s: %w", ScenarioRunCodeRTT, warmTemplateRef, err)
	}
	r.progressf("%s: starting a %s sandbox", ScenarioRunCodeRTT, tpl.Ref())
	sb, err := r.rt.Create(ctx, sandbox.Spec{Template: tpl.Ref()})
	if err != nil {
		return Result{}, err
	}
	defer func() { err = errors.Join(err, destroy(sb)) }()
	ci := newCodeInterpreter(sb)
	defer ci.client.CloseIdleConnections()

	langs := append([]runCodeLang{runCodeBaseline}, runCodeLangs...)
	var sides []side
	for _, l := range langs {
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, runCodeTimeout)
		id, err := ci.newContext(cctx, l.name)
		cancel()
		if err != nil {
			return Result{}, err
		}
		r.progressf("%s: %s context started in %.0f ms", ScenarioRunCodeRTT, l.name, ms(time.Since(start)))
		sides = append(sides, side{l.name + " run", timed(func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, runCodeTimeout)
			defer cancel()
			got, err := ci.run(ctx, id, l.code)
			if err == nil && got != l.want {
				err = fmt.Errorf("%s: %q gave %q, want %q", l.name, l.code, got, l.want)
			}
			return err
		})})
	}
	n := r.cfg.ExecRuns
	ds, err := r.warmRounds(ctx, ScenarioRunCodeRTT, n, 10, sides)
	if err != nil {
		return Result{}, err
	}
	meas := make([]Measurement, len(ds))
	for i, d := range ds {
		meas[i] = summarize(d)
	}
	res := runCodeResult(meas)
	res.Notes = fmt.Sprintf("airlock: POST /execute of a trivial expression (javascript, typescript and r: 1 + 1; "+
		"bash: echo 2) in a code context of that language, to the end of its NDJSON stream, on the code "+
		"interpreter's server in one %s sandbox (%d vCPUs, %d MiB), over HTTP through the sandbox's gateway; "+
		"baseline: the same of 1 + 1 in a Python context (Jupyter's Python kernel); %d rounds after %d untimed, "+
		"each round every language in turn; headline javascript, variants typescript, bash and r, each against "+
		"python; ratio of p50s",
		tpl.Ref(), tpl.VCPUs, tpl.MemoryMiB, n, execWarmup)
	return res, nil
}

// runCodeResult assembles run_code_rtt's result from the measurements of
// runCodeBaseline and then runCodeLangs, in that order.
func runCodeResult(m []Measurement) Result {
	base := m[0]
	res := Result{Name: ScenarioRunCodeRTT, Unit: "ms", Airlock: m[1], Baseline: base, Ratio: ratio(m[1].P50, base.P50)}
	for i, l := range runCodeLangs[1:] {
		res.Variants = append(res.Variants, Variant{Name: l.name, Measurement: m[i+2], Ratio: ratio(m[i+2].P50, base.P50)})
	}
	return res
}
