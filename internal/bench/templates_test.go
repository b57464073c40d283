package bench

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/imagebuild"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/template/oci"
	"github.com/airlockhq/airlock/internal/testenv"
)

func TestTemplateScenariosSelectable(t *testing.T) {
	all := Scenarios()
	i := slices.Index(all, ScenarioTemplateBuild)
	if i < 0 || i+1 >= len(all) || all[i+1] != ScenarioImageCreate {
		t.Fatalf("Scenarios() = %v, want %s followed by %s", all, ScenarioTemplateBuild, ScenarioImageCreate)
	}
	if all[i-1] != ScenarioConcurrent {
		t.Errorf("Scenarios() = %v, want the template scenarios after the fleet's", all)
	}
	for _, s := range []string{ScenarioTemplateBuild, ScenarioImageCreate} {
		if c := (Config{Dir: datadir.Dir{Root: "/x"}, Scenarios: []string{s}}); c.Validate() != nil || !c.selected(s) || c.selected(ScenarioBoot) {
			t.Errorf("--only %s does not select exactly it", s)
		}
	}
}

func TestTemplateBuildRunsConfig(t *testing.T) {
	dir := datadir.Dir{Root: "/x"}
	if got := (Config{Dir: dir}).withDefaults().TemplateBuildRuns; got != 3 {
		t.Errorf("default TemplateBuildRuns = %d, want 3", got)
	}
	if got := (Config{Dir: dir, TemplateBuildRuns: 7}).withDefaults().TemplateBuildRuns; got != 7 {
		t.Errorf("TemplateBuildRuns 7 became %d", got)
	}
	tests := []struct {
		runs    int
		wantErr string // empty: valid
	}{
		{1, ""},
		{maxTemplateBuildRuns, ""},
		{-1, "template build runs must not be negative"},
		{maxTemplateBuildRuns + 1, "template build runs 51 is above the limit of 50"},
	}
	for _, tt := range tests {
		err := (&Config{Dir: dir, KubeBin: "/kube", TemplateBuildRuns: tt.runs}).Validate()
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("Validate(TemplateBuildRuns %d) = %v", tt.runs, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, errdefs.ErrInvalid)):
			t.Errorf("Validate(TemplateBuildRuns %d) = %v, want errdefs.ErrInvalid with %q", tt.runs, err, tt.wantErr)
		}
	}
}

// The Dockerfile is what the service parses: three RUN steps on tiny,
// differing between samples in the first step only.
func TestBuildDockerfile(t *testing.T) {
	one, two := buildSteps("sample-1"), buildSteps("sample-2")
	if len(one) != 3 || one[0] == two[0] || !slices.Equal(one[1:], two[1:]) {
		t.Errorf("steps %q and %q: want three, differing in the first only", one, two)
	}
	rec, err := imagebuild.ParseDockerfile(buildDockerfile(one), nil)
	if err != nil {
		t.Fatal(err)
	}
	if rec.From != buildFrom || len(rec.Steps) != 3 || len(rec.Warnings) != 0 {
		t.Fatalf("parsed %+v, want FROM %s and 3 steps, no warnings", rec, buildFrom)
	}
	for i, st := range rec.Steps {
		if st.Run != one[i] {
			t.Errorf("step %d runs %q, want %q", i+1, st.Run, one[i])
		}
	}
	if !strings.Contains(one[0], "sample-1") || !strings.Contains(one[1], "count=8") {
		t.Errorf("steps %q: want the mark first and 8 MiB written second", one)
	}
}

func TestCachedSteps(t *testing.T) {
	info := func(step int, text string) apiv1.BuildLogLine {
		return apiv1.BuildLogLine{Step: step, Stream: "info", Text: text}
	}
	tests := []struct {
		name  string
		lines []apiv1.BuildLogLine
		want  int
	}{
		{"none", nil, 0},
		{"a cold build", []apiv1.BuildLogLine{
			info(0, "build bench-build:cold-1 from tiny, 3 steps"),
			info(1, "step 1/3: RUN echo sample-1 > /bench-mark"),
			info(1, "starting a build sandbox from sha256:aa"),
			info(1, "saving the result of step 1"),
			info(0, "configuration cached (sha256:bb)"),
		}, 0},
		{"all cached", []apiv1.BuildLogLine{
			info(1, "step 1: cached (sha256:aa)"),
			info(2, "step 2: cached (sha256:bb)"),
			info(3, "step 3: cached (sha256:cc)"),
			info(0, "configuration cached (sha256:dd)"),
		}, 3},
		{"output is not the build's word", []apiv1.BuildLogLine{
			{Step: 2, Stream: "stdout", Text: "step 2: cached (sha256:bb)"},
			info(1, "step 1: cached (sha256:aa)"),
			info(1, "step 1: cached (sha256:aa)"),
		}, 1},
	}
	for _, tt := range tests {
		if got := cachedSteps(tt.lines); got != tt.want {
			t.Errorf("%s: cachedSteps = %d, want %d", tt.name, got, tt.want)
		}
	}
}

func TestTemplateBuildResult(t *testing.T) {
	cold := Measurement{Runs: 3, Min: 20000, P50: 24000, P99: 26000, Max: 26000, Mean: 23000}
	cached := Measurement{Runs: 3, Min: 100, P50: 120, P99: 150, Max: 150, Mean: 125}
	floor := Measurement{Runs: 3, Failures: 1, Min: 5000, P50: 6000, P99: 7000, Max: 7000, Mean: 6000}
	res := templateBuildResult(cold, cached, floor, buildSteps("sample-3"))
	if res.Name != ScenarioTemplateBuild || res.Unit != "ms" || res.Ratio != 4 || res.Airlock != cold || res.Baseline != floor {
		t.Errorf("result %+v", res)
	}
	if len(res.Variants) != 1 || res.Variants[0].Name != "cached" || res.Variants[0].Ratio != 0.02 ||
		res.Variants[0].Measurement != cached || res.Variants[0].Baseline != nil {
		t.Errorf("variants %+v, want cached with ratio 0.02 to the result's baseline", res.Variants)
	}
	for _, want := range []string{"cold-booted (not cloned", "FROM tiny with 3 RUN steps", "dd if=/dev/zero",
		"4096 MiB disk", "ColdBoot", "3 samples each", "cold p50 difference +18000 ms",
		"0 cold, 0 cached and 1 baseline samples failed"} {
		if !strings.Contains(res.Notes, want) {
			t.Errorf("notes lack %q: %s", want, res.Notes)
		}
	}
	if res := templateBuildResult(cold, cached, Measurement{Runs: 3, P50: 6000}, buildSteps("x")); strings.Contains(res.Notes, "retried") {
		t.Errorf("notes speak of retries when there were none: %s", res.Notes)
	}
}

func TestImageCreateResult(t *testing.T) {
	image := Measurement{Runs: 5, Min: 400, P50: 500, P99: 600, Max: 600, Mean: 500}
	builtin := Measurement{Runs: 5, Min: 900, P50: 1000, P99: 1200, Max: 1200, Mean: 1000}
	tiny := template.Template{VCPUs: 1, MemoryMiB: 256, DiskMiB: 256}
	res := imageCreateResult(image, builtin, 2<<20, tiny)
	if res.Name != ScenarioImageCreate || res.Unit != "ms" || res.Ratio != 0.5 || len(res.Variants) != 0 {
		t.Errorf("result %+v", res)
	}
	for _, want := range []string{"template bench-image", "built-in template tiny", "the same static busybox", "1 vCPU, 256 MiB of memory, 256 MiB of disk", "2048 KiB", "oci-archive:<id>",
		"/bin/busybox", "snapshots made beforehand", "5 samples each", "p50 difference -500 ms"} {
		if !strings.Contains(res.Notes, want) {
			t.Errorf("notes lack %q: %s", want, res.Notes)
		}
	}
	if strings.Contains(res.Notes, "retried") {
		t.Errorf("notes speak of retries when there were none: %s", res.Notes)
	}
	builtin.Failures = 2
	if res := imageCreateResult(image, builtin, 1, tiny); !strings.Contains(res.Notes, "0 image and 2 tiny samples failed") {
		t.Errorf("notes do not count the failures: %s", res.Notes)
	}
}

func TestBusyboxImageNeedsAStaticBusybox(t *testing.T) {
	dir := t.TempDir()
	notELF := filepath.Join(dir, "busybox")
	if err := os.WriteFile(notELF, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{filepath.Join(dir, "missing"), notELF} {
		_, err := busyboxImage(path)
		if !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), "busybox-static") {
			t.Errorf("busyboxImage(%s) = %v, want errdefs.ErrPrecondition naming busybox-static", path, err)
		}
	}
}

// The image, written as the scenario uploads it, reads back through the
// service's archive reader with busybox, its two links and PATH.
func TestBusyboxImage(t *testing.T) {
	bb, err := os.ReadFile(hostBusybox)
	if err != nil || !staticELF(bb) {
		testenv.Lacking(t, "no static busybox at %s", hostBusybox)
	}
	img, err := busyboxImage(hostBusybox)
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("airlock-bench/busybox:latest")
	archive := filepath.Join(t.TempDir(), "image.tar")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		t.Fatal(err)
	}
	back, err := oci.OpenArchive(archive)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := oci.ImageConfig(back)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Env, []string{"PATH=/bin"}) {
		t.Errorf("image env %q, want PATH=/bin", cfg.Env)
	}
	cf, err := back.ConfigFile()
	if err != nil || cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("image platform %s/%s (%v), want linux/%s", cf.OS, cf.Architecture, err, runtime.GOARCH)
	}
	layers, err := back.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers (%v), want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got := map[string]string{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeSymlink:
			got[h.Name] = "-> " + h.Linkname
		case tar.TypeReg:
			b, _ := io.ReadAll(tr)
			if !bytes.Equal(b, bb) || h.Mode != 0o755 {
				t.Errorf("%s: %d bytes mode %o, want the host's busybox, mode 755", h.Name, len(b), h.Mode)
			}
			got[h.Name] = "file"
		default:
			got[h.Name] = "dir"
		}
	}
	want := map[string]string{"bin/": "dir", "bin/busybox": "file", "bin/sh": "-> busybox", "bin/echo": "-> busybox"}
	if len(got) != len(want) {
		t.Errorf("layer holds %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("layer's %s is %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
}

// dataDirWithTemplate is fakeDataDir with a stored template name, whose
// image is small and not bootable.
func dataDirWithTemplate(t *testing.T, names ...string) (datadir.Dir, map[string]template.Template) {
	t.Helper()
	dir := fakeDataDir(t)
	store := template.Open(dir)
	out := map[string]template.Template{}
	for _, n := range names {
		tmp, err := store.TempDir("test")
		if err != nil {
			t.Fatal(err)
		}
		img := filepath.Join(tmp, "disk.ext4")
		if err := os.WriteFile(img, []byte("an image of "+n), 0o644); err != nil {
			t.Fatal(err)
		}
		st, err := store.PutImage(context.Background(), img, template.Settings{VCPUs: 1, MemoryMiB: 256, DiskMiB: 256})
		if err != nil {
			t.Fatal(err)
		}
		os.RemoveAll(tmp)
		if out[n], err = store.Tag(n, template.DefaultTag, st.Digest); err != nil {
			t.Fatal(err)
		}
	}
	return dir, out
}

// A templates directory of its own: the images linked, records and tags
// copied, so that the templates resolve there as in the real one, and
// removing or retagging there leaves the real one as it was.
func TestLinkTemplates(t *testing.T) {
	real, tpls := dataDirWithTemplate(t, "tiny", "base")
	dst := datadir.Dir{Root: t.TempDir()}
	if err := linkTemplates(real, dst, []string{"tiny", "base"}); err != nil {
		t.Fatal(err)
	}
	store := template.Open(dst)
	for n, want := range tpls {
		got, err := store.Resolve(n)
		if err != nil {
			t.Fatalf("resolve %s in the copy: %v", n, err)
		}
		if got.Digest != want.Digest || got.Ref() != want.Ref() || got.SizeBytes != want.SizeBytes {
			t.Errorf("%s resolves to %+v, want %+v", n, got, want)
		}
		if target, err := os.Readlink(got.Image); err != nil || target != want.Image {
			t.Errorf("image of %s: link to %q (%v), want %s", n, target, err, want.Image)
		}
		if fi, err := os.Lstat(filepath.Join(dst.Templates(), "refs", n, template.DefaultTag)); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("tag of %s is not a file of its own: %v", n, err)
		}
	}
	if err := store.Untag("tiny", template.DefaultTag); err != nil {
		t.Fatal(err)
	}
	if err := store.RemoveImage(tpls["tiny"].Digest); err != nil {
		t.Fatal(err)
	}
	if _, err := template.Open(real).Resolve("tiny"); err != nil {
		t.Errorf("the real tiny after its copy was removed: %v", err)
	}

	if err := linkTemplates(real, datadir.Dir{Root: t.TempDir()}, []string{"nope"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("linkTemplates of a missing template = %v, want errdefs.ErrNotFound", err)
	}
}

// A home with templates of its own has the real one's boot artifacts and
// accelerator verdict linked and a templates directory, not a link; one
// whose templates cannot be had is removed again.
func TestNewHomeWithTemplates(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	real, _ := dataDirWithTemplate(t, "tiny")
	home, err := newHome(real, []string{"tiny"})
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(home)
	for _, name := range []string{"boot", "accel.json"} {
		if target, err := os.Readlink(filepath.Join(home, name)); err != nil || target != filepath.Join(real.Root, name) {
			t.Errorf("%s links to %q (%v), want the real data directory's", name, target, err)
		}
	}
	if fi, err := os.Lstat(filepath.Join(home, "templates")); err != nil || !fi.IsDir() {
		t.Errorf("templates is not a directory of its own: %v", err)
	}
	if _, err := template.Open(datadir.Dir{Root: home}).Resolve("tiny"); err != nil {
		t.Errorf("tiny in the home: %v", err)
	}

	if _, err := newHome(real, []string{"tiny", "base"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("newHome with a missing template = %v, want errdefs.ErrNotFound", err)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 1 {
		t.Errorf("%d entries in TMPDIR, want only the first home", len(left))
	}
}

// The template scenarios' server starts over its own templates and, closed,
// leaves the real ones as they were.
func TestAPIServerWithTemplatesOfItsOwn(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	real, tpls := dataDirWithTemplate(t, "tiny")
	s, err := startAPIServer(context.Background(), Config{Dir: real, Accel: "tcg"}.withDefaults(), []string{"tiny"}, "")
	if err != nil {
		t.Fatal(err)
	}
	home := s.home
	if fi, err := os.Lstat(filepath.Join(home, "templates")); err != nil || !fi.IsDir() {
		t.Errorf("templates is not a directory of its own: %v", err)
	}
	if _, err := s.bld.GetTemplate(context.Background(), "tiny"); err != nil {
		t.Errorf("the server does not know tiny: %v", err)
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(home); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the temporary data directory is still there: %v", err)
	}
	if got, err := template.Open(real).Resolve("tiny"); err != nil || got.Digest != tpls["tiny"].Digest {
		t.Errorf("the real tiny after close: %+v, %v", got, err)
	}
}
