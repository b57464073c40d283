package bench

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/builds"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/template"
)

// What the template scenarios build and compare.
const (
	// buildFrom is the base of template_build's Dockerfile and the
	// template its baseline boots.
	buildFrom = "tiny"
	// imageBaseline is the built-in template that
	// image_template_create_to_first_output compares the image-built one
	// with: Debian's static busybox, as the image is, so both sides run
	// the same binary; the image's template takes its vCPUs, memory and
	// disk.
	imageBaseline = "tiny"
	// buildName and imageName are the templates the scenarios build.
	buildName = "bench-build"
	imageName = "bench-image"
	// buildDiskMiB is the disk of a build sandbox when the build asks for
	// none, as the service gives it; the baseline's sandbox has the same.
	buildDiskMiB = 4096
	// buildTimeout bounds one build, cold or cached.
	buildTimeout = 10 * time.Minute
	// buildPoll is how long one wait for a build's operation lasts.
	buildPoll = 30 * time.Second
	// hostBusybox is where Debian's busybox-static installs its static
	// busybox, which the image of image_template_create_to_first_output
	// is made of.
	hostBusybox = "/usr/bin/busybox"
)

// templateServer returns the server the template scenarios share,
// starting it on first use. Its templates directory is its own, holding
// buildFrom and imageBaseline, so that builds, and the service's reclaims
// after them, stay out of the data directory's.
func (r *runner) templateServer(ctx context.Context) (*apiServer, error) {
	if r.tplAPI != nil {
		return r.tplAPI, nil
	}
	refs := slices.Compact([]string{buildFrom, imageBaseline}) // one link each
	s, err := startAPIServer(ctx, r.cfg, refs, "")
	if err != nil {
		return nil, fmt.Errorf("start an API server with templates of its own: %w", err)
	}
	r.tplAPI = s
	r.progressf("serving the API on %s from a temporary data directory with templates of its own", s.url)
	return s, nil
}

// buildSteps are the commands of template_build's RUN steps. The first
// writes mark, so that builds with different marks share no step.
func buildSteps(mark string) []string {
	return []string{
		"echo " + mark + " > /bench-mark",
		"dd if=/dev/zero of=/bench-data bs=1048576 count=8 status=none",
		"echo done > /bench-done",
	}
}

// buildDockerfile is a Dockerfile of buildFrom with a RUN step per command.
func buildDockerfile(steps []string) string {
	var b strings.Builder
	b.WriteString("FROM " + buildFrom + "\n")
	for _, c := range steps {
		b.WriteString("RUN " + c + "\n")
	}
	return b.String()
}

// templateBuild measures a build of a Dockerfile of three RUN steps, cold
// (no step cached) and again cached, against booting a sandbox and
// running the same commands in it.
func (r *runner) templateBuild(ctx context.Context) (Result, error) {
	s, err := r.templateServer(ctx)
	if err != nil {
		return Result{}, err
	}
	n := r.cfg.TemplateBuildRuns
	attempt := 0       // cold builds started, failed ones too: each marks its steps
	var steps []string // the last cold build's, which the cached build and the baseline repeat
	cold := func(ctx context.Context) (time.Duration, error) {
		attempt++
		steps = buildSteps(fmt.Sprintf("sample-%d", attempt))
		return s.timeBuild(ctx, fmt.Sprintf("cold-%d", attempt), steps, 0)
	}
	cached := func(ctx context.Context) (time.Duration, error) {
		return s.timeBuild(ctx, fmt.Sprintf("cached-%d", attempt), steps, len(steps))
	}
	floor := func(ctx context.Context) (time.Duration, error) { return r.bootAndRun(ctx, s.rt, steps) }

	i := 1 // the round being measured, for progress lines
	var fails [3]int
	labels := [3]string{"cold build", "cached build", "baseline"}
	var sides []side
	for j, m := range []measure{cold, cached, floor} {
		sides = append(sides, side{labels[j] + " run", retrying(m, maxBootFailures, &fails[j], func(err error) {
			r.progressf("%s %d/%d: %s failed, retrying (%d of %d failures allowed): %s",
				ScenarioTemplateBuild, i, n, labels[j], fails[j], maxBootFailures-1, firstLine(err.Error()))
		})})
	}
	ds, err := timeRounds(ctx, n, sides, func(done int, ds []time.Duration) {
		r.progressf("%s %d/%d: cold %.0f ms, cached %.0f ms, baseline %.0f ms",
			ScenarioTemplateBuild, done, n, ms(ds[0]), ms(ds[1]), ms(ds[2]))
		i = done + 1
	})
	if err != nil {
		return Result{}, err
	}
	sums := make([]Measurement, len(ds))
	for j := range ds {
		sums[j] = summarize(ds[j])
		sums[j].Failures = fails[j]
	}
	return templateBuildResult(sums[0], sums[1], sums[2], steps), nil
}

// templateBuildResult assembles template_build's result: the cold builds
// against the baseline, the cached builds as a variant against the same.
func templateBuildResult(cold, cached, floor Measurement, steps []string) Result {
	notes := fmt.Sprintf("airlock: Service.CreateTemplate of a Dockerfile FROM %s with %d RUN steps (%s), the first "+
		"marked with its sample's number so that no step is cached, until its build operation succeeded: a build "+
		"sandbox cold-booted (not cloned from the template's snapshot) with a %d MiB disk, each step run in it and "+
		"its disk saved as an image (frozen, copied, checked, shrunk, hashed), the template's configuration written "+
		"into the last image, the tag; cached: the same Dockerfile built again, every step and the configuration "+
		"found in the build cache; baseline: sandbox.Runtime.Create of %s booted from scratch (ColdBoot) with the "+
		"same disk, the same commands run with /bin/sh -c through Exec, and its destruction, all timed; both on a "+
		"server in the same process whose templates directory is its own; %d samples each, interleaved; ratios of "+
		"p50s; cold p50 difference %+.0f ms",
		buildFrom, len(steps), strings.Join(steps, "; "), buildDiskMiB, buildFrom, cold.Runs, cold.P50-floor.P50)
	if f := cold.Failures + cached.Failures + floor.Failures; f > 0 {
		notes += fmt.Sprintf("; %d cold, %d cached and %d baseline samples failed and were retried",
			cold.Failures, cached.Failures, floor.Failures)
	}
	return Result{
		Name:     ScenarioTemplateBuild,
		Unit:     "ms",
		Airlock:  cold,
		Baseline: floor,
		Ratio:    ratio(cold.P50, floor.P50),
		Variants: []Variant{{Name: "cached", Measurement: cached, Ratio: ratio(cached.P50, floor.P50)}},
		Notes:    notes,
	}
}

// timeBuild times a build of buildName:tag running steps, through the
// service from CreateTemplate to its operation's success. Its log is then
// read, untimed, to check that wantCached of its steps hit the cache.
func (s *apiServer) timeBuild(ctx context.Context, tag string, steps []string, wantCached int) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	req := apiv1.CreateTemplate{Name: buildName, Tag: tag, Dockerfile: buildDockerfile(steps)}
	start := time.Now()
	if err := s.buildTemplate(ctx, req); err != nil {
		return 0, err
	}
	d := time.Since(start)
	ref := buildName + ":" + tag
	var lines []apiv1.BuildLogLine
	if _, err := s.bld.FollowBuildLog(ctx, ref, 0, func(ln *apiv1.BuildLogLine) error {
		if ln != nil {
			lines = append(lines, *ln)
		}
		return nil
	}); err != nil {
		return 0, fmt.Errorf("read the build log of %s: %w", ref, err)
	}
	if got := cachedSteps(lines); got != wantCached {
		return 0, fmt.Errorf("build of %s: %d of its %d steps were cached, want %d", ref, got, len(steps), wantCached)
	}
	return d, nil
}

// cachedSteps counts the steps a build's log says were cached.
func cachedSteps(lines []apiv1.BuildLogLine) int {
	cached := map[int]bool{}
	for _, ln := range lines {
		if ln.Step > 0 && ln.Stream == "info" && strings.Contains(ln.Text, ": cached (") {
			cached[ln.Step] = true
		}
	}
	return len(cached)
}

// buildTemplate builds req through the service and waits for its build's
// operation; a build that did not succeed is an error.
func (s *apiServer) buildTemplate(ctx context.Context, req apiv1.CreateTemplate) error {
	to, err := s.bld.CreateTemplate(ctx, builds.Principal{KeyID: s.admin.KeyID, Admin: s.admin.Admin()}, req)
	if err != nil {
		return fmt.Errorf("build template %s: %w", req.Name, err)
	}
	op := to.Operation
	for !op.Done() {
		if op, err = s.svc.GetOperation(ctx, s.admin, op.ID, buildPoll); err != nil {
			return fmt.Errorf("wait for the build of template %s: %w", req.Name, err)
		}
	}
	if op.Status != apiv1.OpSucceeded {
		return fmt.Errorf("build template %s: %s", req.Name, opFailure(op))
	}
	return nil
}

// bootAndRun times the floor of a build's work without images: a sandbox
// of buildFrom booted from scratch with a build sandbox's disk, each
// command run in it, and its destruction.
func (r *runner) bootAndRun(ctx context.Context, rt *sandbox.Runtime, steps []string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.BootTimeout+time.Duration(len(steps))*execTimeout)
	defer cancel()
	start := time.Now()
	sb, err := rt.Create(ctx, sandbox.Spec{Template: buildFrom, ColdBoot: true, NoStart: true, DiskMiB: buildDiskMiB})
	if err != nil {
		return 0, err
	}
	for _, cmd := range steps {
		if err := runRequest(ctx, sb, agentproto.ExecRequest{Cmd: cmd, Cwd: "/"}, nil); err != nil {
			return 0, errors.Join(err, destroy(sb))
		}
	}
	if err := destroy(sb); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// imageTemplateCreate measures, over the API, a create to first output
// from a template built from an uploaded OCI image against the same from
// the built-in imageBaseline, on the same server.
func (r *runner) imageTemplateCreate(ctx context.Context) (Result, error) {
	img, err := busyboxImage(hostBusybox)
	if err != nil {
		return Result{}, err
	}
	s, err := r.templateServer(ctx)
	if err != nil {
		return Result{}, err
	}
	like, err := s.rt.Templates().Resolve(imageBaseline)
	if err != nil {
		return Result{}, err
	}
	start := time.Now()
	size, err := s.putImageTemplate(ctx, img, like)
	if err != nil {
		return Result{}, err
	}
	r.progressf("%s: built template %s from an uploaded image in %.0f ms", ScenarioImageCreate, imageName, ms(time.Since(start)))
	for _, tpl := range []string{imageName, imageBaseline} {
		start := time.Now()
		if _, err := s.rt.TemplateSnapshot(ctx, sandbox.Spec{Template: tpl}); err != nil {
			return Result{}, fmt.Errorf("template snapshot of %s: %w", tpl, err)
		}
		r.progressf("%s: template snapshot of %s ready (%.0f ms)", ScenarioImageCreate, tpl, ms(time.Since(start)))
	}
	a, b, err := r.retryingPairs(ctx, ScenarioImageCreate, r.cfg.APIRuns,
		"image", func(ctx context.Context) (time.Duration, error) { return r.apiFirstOutput(ctx, s, imageName) },
		imageBaseline, func(ctx context.Context) (time.Duration, error) { return r.apiFirstOutput(ctx, s, imageBaseline) })
	if err != nil {
		return Result{}, err
	}
	return imageCreateResult(a, b, size, like), nil
}

// imageCreateResult assembles image_template_create_to_first_output's
// result; archiveBytes is the size of the uploaded image.
func imageCreateResult(image, builtin Measurement, archiveBytes int64, like template.Template) Result {
	notes := fmt.Sprintf("airlock: POST /v1/sandboxes of template %s, long polls of its create operation, "+
		"POST /v1/sandboxes/{id}/commands of argv %v, attach, until the first stdout event was read; %s was built "+
		"beforehand, untimed, from an OCI image made in the process (one layer: the host's static busybox as "+
		"/bin/busybox, /bin/sh and /bin/echo linked to it; PATH=/bin), uploaded as a docker save tarball of %d KiB "+
		"through Service.PutBuildContext and built from oci-archive:<id> with no steps and the baseline's "+
		"settings (%d vCPU, %d MiB of memory, %d MiB of disk); baseline: the same for the built-in template %s, "+
		"the same static busybox (Debian's busybox-static) made by airlock setup; both from a server in the same "+
		"process whose templates directory is its own, both templates' snapshots made beforehand for the creates "+
		"to clone; %d samples each, alternating, each sandbox deleted after its sample, untimed; ratio of p50s; "+
		"p50 difference %+.0f ms",
		imageName, firstOutputArgv, imageName, archiveBytes>>10, like.VCPUs, like.MemoryMiB, like.DiskMiB,
		imageBaseline, image.Runs, image.P50-builtin.P50)
	if image.Failures+builtin.Failures > 0 {
		notes += fmt.Sprintf("; %d image and %d %s samples failed and were retried", image.Failures, builtin.Failures, imageBaseline)
	}
	return Result{
		Name:     ScenarioImageCreate,
		Unit:     "ms",
		Airlock:  image,
		Baseline: builtin,
		Ratio:    ratio(image.P50, builtin.P50),
		Notes:    notes,
	}
}

// putImageTemplate uploads img as a docker save tarball and builds
// template imageName from it, with no steps and like's vCPUs, memory and
// disk. It returns the tarball's size.
func (s *apiServer) putImageTemplate(ctx context.Context, img v1.Image, like template.Template) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	tag, err := name.NewTag("airlock-bench/busybox:latest")
	if err != nil {
		return 0, err
	}
	var buf bytes.Buffer
	if err := tarball.Write(tag, img, &buf); err != nil {
		return 0, fmt.Errorf("write the image as a docker save tarball: %w", err)
	}
	size := int64(buf.Len())
	bc, err := s.bld.PutBuildContext(ctx, &buf, s.bld.MaxContextBytes())
	if err != nil {
		return 0, fmt.Errorf("upload the image: %w", err)
	}
	return size, s.buildTemplate(ctx, apiv1.CreateTemplate{Name: imageName, From: "oci-archive:" + bc.ID,
		VCPUs: like.VCPUs, MemoryMiB: like.MemoryMiB, DiskMiB: like.DiskMiB})
}

// busyboxImage is an OCI image of one layer: the static busybox at path
// as /bin/busybox, with /bin/sh and /bin/echo linking to it, and PATH
// /bin. Without a static busybox at path it fails with an error wrapping
// errdefs.ErrPrecondition.
func busyboxImage(path string) (v1.Image, error) {
	bb, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("the image of %s needs the host's static busybox at %s (apt-get install busybox-static): %w: %w",
			ScenarioImageCreate, path, err, errdefs.ErrPrecondition)
	}
	if !staticELF(bb) {
		return nil, fmt.Errorf("the image of %s needs a static busybox, and %s is not a statically linked executable (apt-get install busybox-static): %w",
			ScenarioImageCreate, path, errdefs.ErrPrecondition)
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	epoch := time.Unix(0, 0)
	hdrs := []tar.Header{
		{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bb))},
		{Name: "bin/sh", Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777},
		{Name: "bin/echo", Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777},
	}
	for _, h := range hdrs {
		h.ModTime = epoch
		if err := tw.WriteHeader(&h); err != nil {
			return nil, fmt.Errorf("make the image's layer: %w", err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(bb); err != nil {
				return nil, fmt.Errorf("make the image's layer: %w", err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("make the image's layer: %w", err)
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layer.Bytes())), nil })
	if err != nil {
		return nil, fmt.Errorf("make the image's layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		return nil, fmt.Errorf("make the image: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("make the image: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Env = []string{"PATH=/bin"}
	return mutate.ConfigFile(img, cf)
}

// staticELF reports whether b is an ELF executable without an
// interpreter: one that runs without a dynamic loader.
func staticELF(b []byte) bool {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return f.Type == elf.ET_EXEC || f.Type == elf.ET_DYN
}
