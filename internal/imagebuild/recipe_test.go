package imagebuild

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestStepValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		step Step
		msg  string // "" for a valid step
	}{
		{"run", Step{Run: "pip install numpy"}, ""},
		{"run with args", Step{Run: "make", Args: map[string]string{"V": "1"}}, ""},
		{"env", Step{Env: map[string]string{"K": "V", "_k2": ""}}, ""},
		{"absolute workdir", Step{Workdir: "/app"}, ""},
		{"relative workdir", Step{Workdir: "sub/dir"}, ""},
		{"user", Step{User: "app"}, ""},
		{"user and group", Step{User: "1000:1000"}, ""},
		{"copy", Step{Copy: &Copy{Src: "app/", Dest: "/app", Chown: "app:staff"}}, ""},
		{"copy of the context root", Step{Copy: &Copy{Src: ".", Dest: "/src/"}}, ""},
		{"copy with .. inside", Step{Copy: &Copy{Src: "a/../b", Dest: "d"}}, ""},

		{"nothing", Step{}, "step sets none of run, env, workdir, user and copy"},
		{"two things", Step{Run: "x", User: "app"}, "step sets run and user; a step does exactly one thing"},
		{"empty run", Step{Run: "  \t"}, "run command is empty"},
		{"NUL in run", Step{Run: "echo a\x00"}, "run command contains a NUL byte"},
		{"args without run", Step{User: "app", Args: map[string]string{"A": "1"}}, "args are allowed only in a run step"},
		{"bad arg name", Step{Run: "x", Args: map[string]string{"A-B": "1"}}, `arg name "A-B" is not valid`},
		{"empty env", Step{Env: map[string]string{}}, "env step sets no variables"},
		{"env name with a digit first", Step{Env: map[string]string{"1A": "x"}}, `env name "1A" is not valid`},
		{"env name with =", Step{Env: map[string]string{"A=B": "x"}}, `env name "A=B" is not valid`},
		{"empty env name", Step{Env: map[string]string{"": "x"}}, `env name "" is not valid`},
		{"NUL in env value", Step{Env: map[string]string{"A": "x\x00"}}, "env A contains a NUL byte"},
		{"NUL in workdir", Step{Workdir: "/a\x00"}, "workdir contains a NUL byte"},
		{"blank workdir", Step{Workdir: "  "}, "workdir is empty"},
		{"user with a space", Step{User: "app user"}, "is not a user[:group]"},
		{"user with two colons", Step{User: "a:b:c"}, "is not a user[:group]"},
		{"copy without source", Step{Copy: &Copy{Dest: "/x"}}, "copy source is empty"},
		{"copy without destination", Step{Copy: &Copy{Src: "x"}}, "copy destination is empty"},
		{"copy from outside", Step{Copy: &Copy{Src: "../x", Dest: "/x"}}, "COPY source ../x is outside the build context"},
		{"copy climbing out", Step{Copy: &Copy{Src: "a/../../x", Dest: "/x"}}, "COPY source a/../../x is outside the build context"},
		{"NUL in copy source", Step{Copy: &Copy{Src: "a\x00", Dest: "/x"}}, "copy source contains a NUL byte"},
		{"NUL in copy destination", Step{Copy: &Copy{Src: "a", Dest: "/x\x00"}}, "copy destination contains a NUL byte"},
		{"bad chown", Step{Copy: &Copy{Src: "a", Dest: "/x", Chown: "a b"}}, "copy chown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.step.Validate()
			if tc.msg == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Validate = %v, want ErrInvalid saying %q", err, tc.msg)
			}
		})
	}
}

func TestRecipeValidate(t *testing.T) {
	hex64 := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		name string
		r    Recipe
		msg  string
	}{
		{"template name", Recipe{From: "base"}, ""},
		{"template ref", Recipe{From: "base:latest", Steps: []Step{{Run: "x"}}}, ""},
		{"digest", Recipe{From: "sha256:" + hex64}, ""},
		{"image", Recipe{From: "docker://registry.example.com/team/img:tag"}, ""},
		{"oci archive", Recipe{From: "oci-archive:ctx" + strings.Repeat("0", 24)}, ""},
		{"no from", Recipe{}, "from is empty"},
		{"spaces", Recipe{From: "base latest"}, "contains spaces"},
		{"short digest", Recipe{From: "sha256:abc"}, "is not sha256: and 64 hex digits"},
		{"bare docker://", Recipe{From: "docker://"}, "names no image"},
		{"bad archive id", Recipe{From: "oci-archive:../x"}, "does not name a build context"},
		{"bad step named by index", Recipe{From: "base", Steps: []Step{{Run: "ok"}, {Run: "x", User: "y"}}}, "steps[1]: step sets run and user"},
		{"NUL start_cmd", Recipe{From: "base", StartCmd: "a\x00"}, "start_cmd contains a NUL byte"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.r.Validate()
			if tc.msg == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Validate = %v, want ErrInvalid saying %q", err, tc.msg)
			}
		})
	}
}

func TestStepString(t *testing.T) {
	for _, tc := range []struct {
		step Step
		want string
	}{
		{Step{Run: "make all"}, "RUN make all"},
		{Step{Env: map[string]string{"B": "two words", "A": "1"}}, "ENV A=1 B='two words'"},
		{Step{Workdir: "/app"}, "WORKDIR /app"},
		{Step{User: "app"}, "USER app"},
		{Step{Copy: &Copy{Src: "a", Dest: "/b"}}, "COPY a /b"},
		{Step{Copy: &Copy{Src: "a", Dest: "/b", Chown: "app"}}, "COPY --chown=app a /b"},
	} {
		if got := tc.step.String(); got != tc.want {
			t.Errorf("String = %q, want %q", got, tc.want)
		}
		if got := tc.step.Kind(); got != strings.ToLower(strings.Fields(tc.want)[0]) {
			t.Errorf("Kind of %q = %q", tc.want, got)
		}
	}
}

func TestStateApply(t *testing.T) {
	var s State
	steps := []struct {
		step    Step
		workdir string
	}{
		{Step{Workdir: "app"}, "/app"},
		{Step{Workdir: "sub/"}, "/app/sub"},
		{Step{Workdir: "../lib"}, "/app/lib"},
		{Step{Workdir: "/srv//x/."}, "/srv/x"},
		{Step{Run: "true"}, "/srv/x"},
	}
	for _, st := range steps {
		s = s.Apply(st.step)
		if s.Workdir != st.workdir {
			t.Fatalf("after %s: workdir %q, want %q", st.step, s.Workdir, st.workdir)
		}
	}

	before := State{Env: map[string]string{"A": "1"}}
	after := before.Apply(Step{Env: map[string]string{"A": "2", "B": "3"}}).Apply(Step{User: "app"})
	if !reflect.DeepEqual(before.Env, map[string]string{"A": "1"}) {
		t.Errorf("Apply changed the state it was called on: %v", before.Env)
	}
	if !reflect.DeepEqual(after.Env, map[string]string{"A": "2", "B": "3"}) || after.User != "app" {
		t.Errorf("after: %+v", after)
	}

	env := after.RunEnv(Step{Run: "x", Args: map[string]string{"A": "arg", "C": "arg"}})
	if !reflect.DeepEqual(env, map[string]string{"A": "2", "B": "3", "C": "arg"}) {
		t.Errorf("RunEnv = %v: Env must win over Args", env)
	}
}

func TestStateResolve(t *testing.T) {
	s := State{Workdir: "/app"}
	for in, want := range map[string]string{
		"x":          "/app/x",
		"x/":         "/app/x/",
		".":          "/app",
		"./":         "/app/",
		"/etc/conf":  "/etc/conf",
		"/opt//dir/": "/opt/dir/",
		"../up":      "/up",
		"/":          "/",
	} {
		if got := s.Resolve(in); got != want {
			t.Errorf("Resolve(%q) = %q, want %q", in, got, want)
		}
	}
	if got := (State{}).Resolve("x"); got != "/x" {
		t.Errorf("Resolve with no workdir = %q, want /x", got)
	}
}

func TestCacheKey(t *testing.T) {
	parent := "sha256:" + strings.Repeat("1", 64)
	step := Step{Run: "make", Args: map[string]string{"A": "1", "B": "2"}}
	state := State{Env: map[string]string{"X": "1", "Y": "2"}, Workdir: "/app", User: "app"}
	base := CacheKey(parent, step, state, "")
	if !strings.HasPrefix(base, "sha256:") || len(base) != len("sha256:")+64 {
		t.Fatalf("key %q is not sha256:<hex>", base)
	}
	same := CacheKey(parent,
		Step{Run: "make", Args: map[string]string{"B": "2", "A": "1"}},
		State{Env: map[string]string{"Y": "2", "X": "1"}, Workdir: "/app", User: "app"}, "")
	if same != base {
		t.Errorf("equal inputs give different keys")
	}
	if CacheKey(parent, Step{Run: "x"}, State{}, "") != CacheKey(parent, Step{Run: "x"}, State{Workdir: "/", Env: map[string]string{}}, "") {
		t.Errorf("the default workdir and an empty env are not the same state")
	}
	for name, key := range map[string]string{
		"parent":  CacheKey("sha256:"+strings.Repeat("2", 64), step, state, ""),
		"run":     CacheKey(parent, Step{Run: "make install", Args: step.Args}, state, ""),
		"args":    CacheKey(parent, Step{Run: "make", Args: map[string]string{"A": "1", "B": "3"}}, state, ""),
		"env":     CacheKey(parent, step, State{Env: map[string]string{"X": "1"}, Workdir: "/app", User: "app"}, ""),
		"workdir": CacheKey(parent, step, State{Env: state.Env, Workdir: "/", User: "app"}, ""),
		"user":    CacheKey(parent, step, State{Env: state.Env, Workdir: "/app"}, ""),
		"copy":    CacheKey(parent, step, state, "sha256:"+strings.Repeat("3", 64)),
	} {
		if key == base {
			t.Errorf("changing the %s does not change the key", name)
		}
	}

	// A chain of keys: changing step 2 of 3 keeps the key of step 1 and
	// changes those of steps 2 and 3.
	chain := func(steps []Step) []string {
		var keys []string
		var st State
		prev := parent
		for _, s := range steps {
			prev = CacheKey(prev, s, st, "")
			st = st.Apply(s)
			keys = append(keys, prev)
		}
		return keys
	}
	a := chain([]Step{{Run: "one"}, {Env: map[string]string{"K": "1"}}, {Run: "three"}})
	b := chain([]Step{{Run: "one"}, {Env: map[string]string{"K": "2"}}, {Run: "three"}})
	if a[0] != b[0] || a[1] == b[1] || a[2] == b[2] {
		t.Errorf("chained keys: %v vs %v", a, b)
	}
}
