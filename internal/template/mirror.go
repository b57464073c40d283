package template

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// AptMirror returns the Debian archive URL that the host's apt configuration
// under aptDir (normally /etc/apt) uses for suite: the URIs of a deb822
// entry in sources.list.d/*.sources whose Suites include it, else a
// "deb URL suite ..." line of sources.list or sources.list.d/*.list. It
// fails with errdefs.ErrPrecondition when there is none.
func AptMirror(aptDir, suite string) (string, error) {
	sources, _ := filepath.Glob(filepath.Join(aptDir, "sources.list.d", "*.sources"))
	for _, p := range sources {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if u := mirrorFromDeb822(string(b), suite); u != "" {
			return u, nil
		}
	}
	lists, _ := filepath.Glob(filepath.Join(aptDir, "sources.list.d", "*.list"))
	lists = append([]string{filepath.Join(aptDir, "sources.list")}, lists...)
	for _, p := range lists {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if u := mirrorFromOneLine(string(b), suite); u != "" {
			return u, nil
		}
	}
	return "", fmt.Errorf("find a Debian mirror: no apt source for %s in %s; pass the mirror URL explicitly: %w",
		suite, aptDir, errdefs.ErrPrecondition)
}

// mirrorFromDeb822 returns the first URI of an enabled "Types: deb" stanza
// whose Suites list suite.
func mirrorFromDeb822(text, suite string) string {
	for _, stanza := range strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n\n") {
		fields := make(map[string]string)
		var last string
		for _, line := range strings.Split(stanza, "\n") {
			if strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
				continue
			}
			if (line[0] == ' ' || line[0] == '\t') && last != "" {
				fields[last] += " " + strings.TrimSpace(line)
				continue
			}
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			last = strings.ToLower(strings.TrimSpace(k))
			fields[last] = strings.TrimSpace(v)
		}
		if strings.EqualFold(fields["enabled"], "no") ||
			!slices.Contains(strings.Fields(fields["types"]), "deb") ||
			!slices.Contains(strings.Fields(fields["suites"]), suite) {
			continue
		}
		if uris := strings.Fields(fields["uris"]); len(uris) > 0 {
			return strings.TrimSuffix(uris[0], "/")
		}
	}
	return ""
}

// mirrorFromOneLine returns the URL of the first "deb [options] URL suite"
// line of a sources.list.
func mirrorFromOneLine(text, suite string) string {
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") {
			for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
				f = f[1:]
			}
			if len(f) == 0 {
				continue
			}
			f = f[1:]
		}
		if len(f) >= 2 && f[1] == suite {
			return strings.TrimSuffix(f[0], "/")
		}
	}
	return ""
}
