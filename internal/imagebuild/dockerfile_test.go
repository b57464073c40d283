package imagebuild

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestParseDockerfile(t *testing.T) {
	for _, tc := range []struct {
		name     string
		text     string
		args     map[string]string
		want     Recipe
		warnings []string // substrings, one per warning, in order
	}{{
		name: "minimal",
		text: "FROM base\nRUN echo hi\n",
		want: Recipe{From: "base", Steps: []Step{{Run: "echo hi"}}},
	}, {
		name: "lower-case instructions and CRLF",
		text: "from base:latest\r\nrun echo hi\r\n",
		want: Recipe{From: "base:latest", Steps: []Step{{Run: "echo hi"}}},
	}, {
		name: "comments and continuations",
		text: "# a comment\nFROM base\n\n# another\nRUN apt-get update && \\\n    apt-get install -y curl\nRUN echo \\\n# skipped inside a continuation\n  done\n",
		want: Recipe{From: "base", Steps: []Step{
			{Run: "apt-get update &&     apt-get install -y curl"},
			{Run: "echo   done"},
		}},
	}, {
		name: "escape directive",
		text: "# escape=`\nFROM base\nRUN echo a `\n  b\nWORKDIR C:\\app\n",
		want: Recipe{From: "base", Steps: []Step{{Run: "echo a   b"}, {Workdir: `C:\app`}}},
	}, {
		name: "syntax directive is harmless",
		text: "# syntax=docker/dockerfile:1\nFROM base\nRUN true\n",
		want: Recipe{From: "base", Steps: []Step{{Run: "true"}}},
	}, {
		name: "RUN exec form is quoted word by word",
		text: `FROM base
RUN ["echo", "hello world", "it's", "$HOME", "plain-word_1.2"]
RUN ["if", "FOO=bar"]
`,
		want: Recipe{From: "base", Steps: []Step{
			{Run: `echo 'hello world' 'it'\''s' '$HOME' plain-word_1.2`},
			{Run: `'if' 'FOO=bar'`},
		}},
	}, {
		name: "RUN with invalid JSON is shell form, as in Docker",
		text: "FROM base\nRUN [\"echo\", oops\n",
		want: Recipe{From: "base", Steps: []Step{{Run: `["echo", oops`}}},
	}, {
		name: "ENV forms",
		text: `FROM base
ENV A=1 B="two words" C=three\ words
ENV D four  words
ENV E=$A-${B}
`,
		want: Recipe{From: "base", Steps: []Step{
			{Env: map[string]string{"A": "1", "B": "two words", "C": "three words"}},
			{Env: map[string]string{"D": "four  words"}},
			{Env: map[string]string{"E": "1-two words"}},
		}},
	}, {
		name: "ENV substitutes with the values before the instruction",
		text: "FROM base\nENV X=old\nENV X=new Y=$X\n",
		want: Recipe{From: "base", Steps: []Step{
			{Env: map[string]string{"X": "old"}},
			{Env: map[string]string{"X": "new", "Y": "old"}},
		}},
	}, {
		name: "ARG defaults, overrides and RUN args",
		text: `ARG VERSION=1.0
FROM base:$VERSION
ARG VERSION
ARG USERNAME=app
ARG HOME_DIR=/home/${USERNAME}
RUN install $VERSION
USER $USERNAME
WORKDIR $HOME_DIR
`,
		args: map[string]string{"VERSION": "2.0"},
		want: Recipe{From: "base:2.0", Steps: []Step{
			{Run: "install $VERSION", Args: map[string]string{"VERSION": "2.0", "USERNAME": "app", "HOME_DIR": "/home/app"}},
			{User: "app"},
			{Workdir: "/home/app"},
		}, Args: map[string]string{"VERSION": "2.0", "USERNAME": "app", "HOME_DIR": "/home/app"}},
	}, {
		name: "ARG default without override, several in one ARG",
		text: "FROM base\nARG A=1 B=2\nRUN x\n",
		want: Recipe{From: "base", Steps: []Step{{Run: "x", Args: map[string]string{"A": "1", "B": "2"}}},
			Args: map[string]string{"A": "1", "B": "2"}},
	}, {
		name: "a meta ARG is out of scope after FROM unless declared again",
		text: "ARG V=1\nFROM base\nRUN echo $V\nWORKDIR /x$V\nARG V\nRUN echo $V\n",
		want: Recipe{From: "base", Steps: []Step{
			{Run: "echo $V"},
			{Workdir: "/x"},
			{Run: "echo $V", Args: map[string]string{"V": "1"}},
		}, Args: map[string]string{"V": "1"}},
	}, {
		name: "an ARG without value or override is unset",
		text: "FROM base\nARG EMPTY\nRUN x\n",
		want: Recipe{From: "base", Steps: []Step{{Run: "x"}}},
	}, {
		name: "ENV hides an ARG of the same name",
		text: "FROM base\nARG A=arg\nENV A=env\nRUN x\nWORKDIR /$A\n",
		want: Recipe{From: "base", Steps: []Step{
			{Env: map[string]string{"A": "env"}},
			{Run: "x"},
			{Workdir: "/env"},
		}, Args: map[string]string{"A": "arg"}},
	}, {
		name: "default and alternative substitution",
		text: "FROM base\nENV SET=yes\nWORKDIR ${DIR:-/srv}\nWORKDIR ${SET:+/alt}\nUSER ${NOBODY:-app}:${GROUP-staff}\n",
		want: Recipe{From: "base", Steps: []Step{
			{Env: map[string]string{"SET": "yes"}},
			{Workdir: "/srv"},
			{Workdir: "/alt"},
			{User: "app:staff"},
		}},
	}, {
		name: "COPY and ADD of local paths",
		text: `FROM base
COPY --chown=app:app src/ /app/
COPY a b /dst/
COPY ["with space", "/d"]
ADD conf.txt /etc/conf.txt
COPY --link x /y
`,
		want: Recipe{From: "base", Steps: []Step{
			{Copy: &Copy{Src: "src/", Dest: "/app/", Chown: "app:app"}},
			{Copy: &Copy{Src: "a", Dest: "/dst/"}},
			{Copy: &Copy{Src: "b", Dest: "/dst/"}},
			{Copy: &Copy{Src: "with space", Dest: "/d"}},
			{Copy: &Copy{Src: "conf.txt", Dest: "/etc/conf.txt"}},
			{Copy: &Copy{Src: "x", Dest: "/y"}},
		}},
	}, {
		name: "COPY substitutes ARG and ENV",
		text: "FROM base\nARG SRC=app\nARG OWNER=1000\nENV DEST=/opt\nCOPY --chown=$OWNER $SRC ${DEST}/\n",
		want: Recipe{From: "base", Steps: []Step{
			{Env: map[string]string{"DEST": "/opt"}},
			{Copy: &Copy{Src: "app", Dest: "/opt/", Chown: "1000"}},
		}, Args: map[string]string{"SRC": "app", "OWNER": "1000"}},
	}, {
		name: "relative WORKDIR is kept for the state to resolve",
		text: "FROM base\nWORKDIR /app\nWORKDIR sub\n",
		want: Recipe{From: "base", Steps: []Step{{Workdir: "/app"}, {Workdir: "sub"}}},
	}, {
		name: "CMD shell form",
		text: "FROM base\nCMD python app.py --port 80\n",
		want: Recipe{From: "base", StartCmd: "python app.py --port 80"},
	}, {
		name: "CMD exec form",
		text: `FROM base
CMD ["python", "app.py", "a b"]
`,
		want: Recipe{From: "base", StartCmd: "python app.py 'a b'"},
	}, {
		name: "ENTRYPOINT exec and CMD exec",
		text: "FROM base\nCMD [\"8080\"]\nENTRYPOINT [\"python\", \"-m\", \"http.server\"]\n",
		want: Recipe{From: "base", StartCmd: "python -m http.server 8080"},
	}, {
		name: "ENTRYPOINT exec and CMD shell",
		text: "FROM base\nENTRYPOINT [\"/entry.sh\"]\nCMD echo hi\n",
		want: Recipe{From: "base", StartCmd: "/entry.sh /bin/sh -c 'echo hi'"},
	}, {
		name:     "ENTRYPOINT shell form drops CMD",
		text:     "FROM base\nENTRYPOINT exec server --x\nCMD [\"--y\"]\n",
		want:     Recipe{From: "base", StartCmd: "exec server --x"},
		warnings: []string{"CMD is ignored"},
	}, {
		name: "ENTRYPOINT alone, the last CMD wins, an empty CMD",
		text: "FROM base\nCMD a\nCMD b\nENTRYPOINT [\"srv\"]\nCMD []\n",
		want: Recipe{From: "base", StartCmd: "srv"},
	}, {
		name: "CMD /bin/sh -c in exec form is its command",
		text: "FROM base\nCMD [\"/bin/sh\", \"-c\", \"a && b\"]\n",
		want: Recipe{From: "base", StartCmd: "a && b"},
	}, {
		name: "harmless instructions are ignored with warnings",
		text: "FROM base\nEXPOSE 80\nLABEL a=b\nMAINTAINER me\nVOLUME /data\nSTOPSIGNAL SIGTERM\nHEALTHCHECK CMD curl -f localhost\nRUN x\n",
		want: Recipe{From: "base", Steps: []Step{{Run: "x"}}},
		warnings: []string{
			"line 2: EXPOSE is ignored", "line 3: LABEL is ignored", "line 4: MAINTAINER is ignored",
			"line 5: VOLUME is ignored", "line 6: STOPSIGNAL is ignored", "line 7: HEALTHCHECK is ignored",
		},
	}, {
		name:     "an undeclared build arg is reported",
		text:     "FROM base\nRUN x\n",
		args:     map[string]string{"TYPO": "1"},
		want:     Recipe{From: "base", Steps: []Step{{Run: "x"}}},
		warnings: []string{"build arg TYPO is not declared"},
	}, {
		name: "proxy build args reach RUN without ARG",
		text: "FROM base\nRUN x\n",
		args: map[string]string{"HTTP_PROXY": "http://proxy:3128"},
		want: Recipe{From: "base", Steps: []Step{{Run: "x", Args: map[string]string{"HTTP_PROXY": "http://proxy:3128"}}}},
	}, {
		name: "FROM AS in a single stage",
		text: "FROM base AS build\nRUN make\n",
		want: Recipe{From: "base", Steps: []Step{{Run: "make"}}},
	}, {
		name: "FROM docker:// passes through",
		text: "FROM docker://registry.example.com/team/img:tag\n",
		want: Recipe{From: "docker://registry.example.com/team/img:tag"},
	}, {
		name: "FROM an image name is kept verbatim",
		text: "ARG PY=3.12\nFROM python:${PY}-slim\n",
		want: Recipe{From: "python:3.12-slim"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseDockerfile(tc.text, tc.args)
			if err != nil {
				t.Fatalf("ParseDockerfile: %v", err)
			}
			warnings := got.Warnings
			got.Warnings = nil
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %s\nwant %s", dump(got), dump(tc.want))
			}
			if len(warnings) != len(tc.warnings) {
				t.Fatalf("warnings %q, want %d like %q", warnings, len(tc.warnings), tc.warnings)
			}
			for i, w := range tc.warnings {
				if !strings.Contains(warnings[i], w) {
					t.Errorf("warning %d is %q, want it to say %q", i, warnings[i], w)
				}
			}
			if err := got.Validate(); err != nil {
				t.Errorf("the recipe does not validate: %v", err)
			}
		})
	}
}

func dump(r Recipe) string {
	var b strings.Builder
	b.WriteString("from=" + r.From + " start=" + r.StartCmd + " steps=[")
	for _, s := range r.Steps {
		b.WriteString(s.String())
		if s.Args != nil {
			b.WriteString(" args=")
			b.WriteString(strings.Join(sortedKV(s.Args), ","))
		}
		b.WriteString("; ")
	}
	b.WriteString("] args=" + strings.Join(sortedKV(r.Args), ","))
	return b.String()
}

func sortedKV(m map[string]string) []string {
	var kv []string
	for k, v := range m {
		kv = append(kv, k+"="+v)
	}
	return kv
}

func TestParseDockerfileErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		text string
		is   error
		msg  string
	}{
		{"empty", "", errdefs.ErrInvalid, "dockerfile has no instructions"},
		{"whitespace", "  \n\t\n\n", errdefs.ErrInvalid, "dockerfile has no instructions"},
		{"only comments", "# one\n# two\n", errdefs.ErrInvalid, "dockerfile has no instructions"},
		{"no FROM", "ARG A=1\n", errdefs.ErrInvalid, "dockerfile has no FROM"},
		{"RUN before FROM", "RUN x\nFROM base\n", errdefs.ErrInvalid, "dockerfile line 1: RUN before FROM"},
		{"second FROM", "FROM a AS build\nRUN make\nFROM b\nCOPY --from=build /x /x\n", errdefs.ErrInvalid,
			"dockerfile line 3: a second FROM: multi-stage builds are not supported"},
		{"COPY --from", "FROM a\nCOPY --from=build /x /x\n", errdefs.ErrInvalid,
			"dockerfile line 2: COPY --from: multi-stage builds are not supported"},
		{"SHELL", "FROM base\nRUN x\nEXPOSE 80\nSHELL [\"/bin/bash\", \"-c\"]\n", errdefs.ErrInvalid,
			"dockerfile line 4: SHELL is not supported"},
		{"ONBUILD", "FROM base\nONBUILD RUN x\n", errdefs.ErrInvalid, "dockerfile line 2: ONBUILD is not supported"},
		{"unknown instruction", "FROM base\n\nFOO bar\n", errdefs.ErrInvalid, "dockerfile line 3: unknown instruction FOO"},
		{"ADD URL", "FROM base\nADD https://example.com/x.txt /x\n", errdefs.ErrInvalid,
			"dockerfile line 2: ADD of a URL (https://example.com/x.txt) is not supported"},
		{"ADD git", "FROM base\nADD git@github.com:a/b.git /src\n", errdefs.ErrInvalid, "ADD of a git repository"},
		{"ADD git URL", "FROM base\nADD https://github.com/a/b.git /src\n", errdefs.ErrInvalid, "ADD of a git repository"},
		{"ADD archive", "FROM base\nADD app.tar.gz /app/\n", errdefs.ErrInvalid, "ADD of the archive app.tar.gz is not supported"},
		{"ADD --checksum", "FROM base\nADD --checksum=sha256:00 a /a\n", errdefs.ErrInvalid, "ADD --checksum is not supported"},
		{"huge line", "FROM base\nRUN echo " + strings.Repeat("x", 70000) + "\n", errdefs.ErrInvalid,
			"dockerfile line 2 is longer than 65535 bytes"},
		{"too large", "FROM base\n" + strings.Repeat("RUN echo xxxxxxxxxxxxxxxxxxxxxxxx\n", 40000), errdefs.ErrTooLarge,
			"over the limit of 1048576 bytes"},
		{"NUL", "FROM base\nRUN a\x00b\n", errdefs.ErrInvalid, "NUL byte"},
		{"FROM scratch", "FROM scratch\n", errdefs.ErrInvalid, "dockerfile line 1: FROM scratch is not supported"},
		{"FROM --platform", "FROM --platform=linux/arm64 base\n", errdefs.ErrInvalid, "FROM --platform=linux/arm64 is not supported"},
		{"FROM empty after substitution", "ARG IMG\nFROM $IMG\n", errdefs.ErrInvalid, "FROM $IMG is empty after substitution"},
		{"FROM with extra words", "FROM a b\n", errdefs.ErrInvalid, "FROM takes an image"},
		{"RUN --mount", "FROM base\nRUN --mount=type=cache,target=/root/.cache pip install x\n", errdefs.ErrInvalid,
			"dockerfile line 2: RUN --mount is not supported"},
		{"here-document", "FROM base\nRUN <<EOF\necho hi\nEOF\n", errdefs.ErrInvalid,
			"dockerfile line 2: RUN with a here-document is not supported"},
		{"empty RUN exec form", "FROM base\nRUN []\n", errdefs.ErrInvalid, "RUN needs a command"},
		{"COPY outside the context", "FROM base\nCOPY ../x /x\n", errdefs.ErrInvalid,
			"dockerfile line 2: COPY source ../x is outside the build context"},
		{"COPY one argument", "FROM base\nCOPY onlyone\n", errdefs.ErrInvalid, "COPY needs a source and a destination"},
		{"COPY several sources to a file", "FROM base\nCOPY a b /dst\n", errdefs.ErrInvalid, "needs a destination directory ending in /"},
		{"COPY --chmod", "FROM base\nCOPY --chmod=755 a /a\n", errdefs.ErrInvalid, "COPY --chmod is not supported"},
		{"COPY bad chown", "FROM base\nCOPY --chown=a:b:c x /x\n", errdefs.ErrInvalid, "dockerfile line 2: copy chown"},
		{"ENV bad name", "FROM base\nENV 1A=x\n", errdefs.ErrInvalid, `dockerfile line 2: env name "1A" is not valid`},
		{"ENV without value", "FROM base\nENV A\n", errdefs.ErrInvalid, "dockerfile line 2: ENV must have two arguments"},
		{"ARG bad name", "FROM base\nARG a-b=1\n", errdefs.ErrInvalid, `ARG name "a-b" is not valid`},
		{"required variable", "FROM base\nWORKDIR ${DIR:?set DIR}\n", errdefs.ErrInvalid, "dockerfile line 2:"},
		{"CMD without command", "FROM base\nCMD\n", errdefs.ErrInvalid, "dockerfile line 2: CMD needs a command"},
		{"USER with spaces", "FROM base\nUSER a b\n", errdefs.ErrInvalid, "dockerfile line 2: user"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseDockerfile(tc.text, nil)
			if err == nil {
				t.Fatalf("got %s, want an error", dump(r))
			}
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("got %v, want %v saying %q", err, tc.is, tc.msg)
			}
		})
	}
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{
		"plain":     "plain",
		"/usr/bin":  "/usr/bin",
		"":          "''",
		"a b":       "'a b'",
		"it's":      `'it'\''s'`,
		"$HOME":     "'$HOME'",
		"a;b":       "'a;b'",
		"~":         "'~'",
		"K=V":       "'K=V'",
		"then":      "'then'",
		"line\nnew": "'line\nnew'",
	} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
	}
	if got := ShellJoin([]string{"echo", "a b", ""}); got != "echo 'a b' ''" {
		t.Errorf("ShellJoin = %s", got)
	}
}
