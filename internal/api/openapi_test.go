package api

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The spec in docs/openapi.yaml lists exactly the routes the server serves.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ops, err := openAPIOperations(data)
	if err != nil {
		t.Fatalf("docs/openapi.yaml: %v", err)
	}
	inSpec := map[string]bool{}
	for _, op := range ops {
		inSpec[op.Method+" "+op.Path] = true
	}
	served := map[string]bool{}
	for _, r := range Routes() {
		served[strings.ToUpper(r.Method)+" "+r.Path] = true
	}
	if len(served) == 0 {
		t.Fatal("Routes() is empty")
	}

	var notInSpec, notServed []string
	for k := range served {
		if !inSpec[k] {
			notInSpec = append(notInSpec, k)
		}
	}
	for k := range inSpec {
		if !served[k] {
			notServed = append(notServed, k)
		}
	}
	slices.Sort(notInSpec)
	slices.Sort(notServed)
	if len(notInSpec) > 0 {
		t.Errorf("served but missing from docs/openapi.yaml:\n\t%s", strings.Join(notInSpec, "\n\t"))
	}
	if len(notServed) > 0 {
		t.Errorf("in docs/openapi.yaml but not served:\n\t%s", strings.Join(notServed, "\n\t"))
	}
}

// The scanner reads what the route test depends on, and rejects a spec that
// is not shaped like one.
func TestOpenAPIScanner(t *testing.T) {
	good := `openapi: 3.1.0
info:
  title: t
  description: |
    paths:
      /not/a/path:
        get: {}
paths:
  # a comment
  /v1/things/{id}:
    parameters:
    - name: id
      in: path
    get:
      summary: "x: y"
      description: >-
        responses:
          get:
      responses:
        "200":
          description: ok
    delete:
      description: |2
          put:
        responses:
      responses:
        default:
          description: error # a comment
  "/healthz":
    get:
      responses:
        '200':
          description: ok
components:
  schemas:
    X:
      type: object
`
	ops, err := openAPIOperations([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, op := range ops {
		got = append(got, op.Method+" "+op.Path)
	}
	want := []string{"GET /v1/things/{id}", "DELETE /v1/things/{id}", "GET /healthz"}
	if !slices.Equal(got, want) {
		t.Errorf("operations = %q, want %q", got, want)
	}

	bad := []struct {
		name, spec, want string
	}{
		{"no paths", "openapi: 3.1.0\ninfo:\n  title: t\n", "no paths section"},
		{"not openapi 3", "swagger: \"2.0\"\npaths:\n  /a:\n    get:\n      responses:\n        \"200\":\n          description: ok\n", "openapi: 3."},
		{"path without methods", "openapi: 3.1.0\npaths:\n  /a:\n    summary: x\n", "/a has no operations"},
		{"method without responses", "openapi: 3.1.0\npaths:\n  /a:\n    get:\n      summary: x\n", "GET /a has no responses"},
		{"empty responses", "openapi: 3.1.0\npaths:\n  /a:\n    get:\n      responses: {}\n", "GET /a has no responses"},
		{"duplicate path", "openapi: 3.1.0\npaths:\n  /a:\n    get:\n      responses:\n        \"200\":\n          description: ok\n  /a:\n    put:\n      responses:\n        \"200\":\n          description: ok\n", "/a appears twice"},
		{"duplicate method", "openapi: 3.1.0\npaths:\n  /a:\n    get:\n      responses:\n        \"200\":\n          description: ok\n    get:\n      responses:\n        \"200\":\n          description: ok\n", "GET /a appears twice"},
		{"unknown path key", "openapi: 3.1.0\npaths:\n  /a:\n    fetch:\n      responses:\n        \"200\":\n          description: ok\n", `unknown key "fetch"`},
		{"path not absolute", "openapi: 3.1.0\npaths:\n  v1/a:\n    get:\n      responses:\n        \"200\":\n          description: ok\n", "does not start with /"},
		{"tab indent", "openapi: 3.1.0\npaths:\n\t/a:\n", "tab"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			_, err := openAPIOperations([]byte(tt.spec))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// openAPIOp is one operation of an OpenAPI document.
type openAPIOp struct {
	Method, Path string
}

// openAPIPathKeys are the keys a path item may hold besides its operations.
var openAPIPathKeys = map[string]bool{"summary": true, "description": true, "parameters": true, "servers": true, "$ref": true}

// openAPIMethods are the operation keys of a path item.
var openAPIMethods = map[string]bool{"get": true, "put": true, "post": true, "delete": true,
	"options": true, "head": true, "patch": true, "trace": true}

// openAPIOperations lists the (method, path) pairs of an OpenAPI 3 document
// written in block-style YAML, in the order they appear. It reads only what
// it needs, by indentation: the top-level "paths" mapping, the path items
// under it, their operations, and whether each operation has a non-empty
// "responses" mapping. Comments and block scalars (| and >) are skipped, so
// text inside a description cannot be taken for a key.
func openAPIOperations(data []byte) ([]openAPIOp, error) {
	type line struct {
		no     int
		indent int
		key    string // "" when the line is not a "key:" line
		value  string // what follows "key:", trimmed
		item   bool   // a list item ("- ...")
	}
	var lines []line
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	blockIndent := -1 // inside a block scalar started at this indent, else -1
	for no := 1; sc.Scan(); no++ {
		raw := strings.TrimRight(sc.Text(), " \r")
		body := strings.TrimLeft(raw, " ")
		indent := len(raw) - len(body)
		if blockIndent >= 0 {
			if body == "" || indent > blockIndent {
				continue
			}
			blockIndent = -1
		}
		if body == "" || strings.HasPrefix(body, "#") || body == "---" {
			continue
		}
		if strings.HasPrefix(body, "\t") {
			return nil, fmt.Errorf("line %d: tab in indentation", no)
		}
		if body == "-" || strings.HasPrefix(body, "- ") {
			lines = append(lines, line{no: no, indent: indent, item: true})
			continue
		}
		key, value, ok := openAPIKey(body)
		if !ok {
			lines = append(lines, line{no: no, indent: indent})
			continue
		}
		if openAPIBlockScalar(value) {
			blockIndent = indent
		}
		lines = append(lines, line{no: no, indent: indent, key: key, value: value})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}

	// children returns the lines directly under lines[i]: the ones after it
	// that are indented deeper, up to the first that is not, and among them
	// those at the first one's indent.
	children := func(i int) []int {
		var out []int
		childIndent := -1
		for j := i + 1; j < len(lines) && lines[j].indent > lines[i].indent; j++ {
			if childIndent < 0 {
				childIndent = lines[j].indent
			}
			if lines[j].indent == childIndent {
				out = append(out, j)
			}
		}
		return out
	}

	pathsAt, version := -1, ""
	for i, l := range lines {
		if l.indent != 0 {
			continue
		}
		switch l.key {
		case "openapi":
			version = strings.Trim(l.value, `"'`)
		case "paths":
			if pathsAt >= 0 {
				return nil, fmt.Errorf("line %d: paths appears twice", l.no)
			}
			pathsAt = i
		}
	}
	if !strings.HasPrefix(version, "3.") {
		return nil, fmt.Errorf("want openapi: 3.x at the top, got %q", version)
	}
	if pathsAt < 0 {
		return nil, fmt.Errorf("no paths section")
	}

	var ops []openAPIOp
	seenPaths := map[string]bool{}
	seenOps := map[openAPIOp]bool{}
	for _, pi := range children(pathsAt) {
		p := lines[pi]
		if p.item || p.key == "" {
			return nil, fmt.Errorf("line %d: want a path key under paths", p.no)
		}
		if !strings.HasPrefix(p.key, "/") {
			return nil, fmt.Errorf("line %d: path %q does not start with /", p.no, p.key)
		}
		if seenPaths[p.key] {
			return nil, fmt.Errorf("line %d: path %s appears twice", p.no, p.key)
		}
		seenPaths[p.key] = true
		n := 0
		for _, mi := range children(pi) {
			m := lines[mi]
			switch {
			case m.item || openAPIPathKeys[m.key]:
				continue // a list item here belongs to the key before it
			case !openAPIMethods[m.key]:
				return nil, fmt.Errorf("line %d: unknown key %q in path %s", m.no, m.key, p.key)
			}
			op := openAPIOp{Method: strings.ToUpper(m.key), Path: p.key}
			if seenOps[op] {
				return nil, fmt.Errorf("line %d: %s %s appears twice", m.no, op.Method, op.Path)
			}
			seenOps[op] = true
			responses := 0
			for _, ki := range children(mi) {
				if lines[ki].key == "responses" {
					responses = len(children(ki))
				}
			}
			if responses == 0 {
				return nil, fmt.Errorf("line %d: %s %s has no responses", m.no, op.Method, op.Path)
			}
			ops = append(ops, op)
			n++
		}
		if n == 0 {
			return nil, fmt.Errorf("line %d: path %s has no operations", p.no, p.key)
		}
	}
	return ops, nil
}

// openAPIKey splits a "key: value" or "key:" line of block-style YAML; the
// key may be quoted.
func openAPIKey(body string) (key, value string, ok bool) {
	if q := body[0]; q == '"' || q == '\'' {
		end := strings.IndexByte(body[1:], q)
		if end < 0 {
			return "", "", false
		}
		key, rest := body[1:1+end], body[2+end:]
		if !strings.HasPrefix(rest, ":") {
			return "", "", false
		}
		return key, openAPIValue(rest[1:]), true
	}
	i := strings.Index(body, ": ")
	if i < 0 {
		if !strings.HasSuffix(body, ":") {
			return "", "", false
		}
		i = len(body) - 1
	}
	if i == 0 {
		return "", "", false
	}
	return body[:i], openAPIValue(body[i+1:]), true
}

// openAPIValue trims a value and drops a trailing comment.
func openAPIValue(s string) string {
	s = strings.TrimSpace(s)
	if s == "" || s[0] == '"' || s[0] == '\'' {
		return s
	}
	if i := strings.Index(s, " #"); i >= 0 {
		s = strings.TrimSpace(s[:i])
	}
	return s
}

// openAPIBlockScalar reports whether a value starts a block scalar: | or >
// with optional chomping and indentation indicators.
func openAPIBlockScalar(value string) bool {
	if value == "" || (value[0] != '|' && value[0] != '>') {
		return false
	}
	return strings.Trim(value[1:], "+-0123456789") == ""
}
