package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/airlockhq/airlock/internal/sandbox"
)

// jailCost measures what the jail costs (docs/hardening.md): a create
// from the template snapshot to first output, and the round trip of an
// exec, with the jail and cgroup on (the default runtime) against the
// same with them off (a runtime over the same data directory with
// Unjailed), alternating, in the same run.
func (r *runner) jailCost(ctx context.Context) (Result, error) {
	if !r.rt.Jailed() {
		return Result{}, fmt.Errorf("%s needs the jail on", ScenarioJail)
	}
	off, err := sandbox.New(ctx, sandbox.Config{Dir: r.cfg.Dir, Accel: r.cfg.Accel, BootTimeout: r.cfg.BootTimeout, Log: r.cfg.Log, Unjailed: true})
	if err != nil {
		return Result{}, err
	}
	if _, err := r.rt.TemplateSnapshot(ctx, sandbox.Spec{Template: r.cfg.Template}); err != nil {
		return Result{}, fmt.Errorf("template snapshot: %w", err)
	}
	n := r.cfg.SnapshotRuns
	on := func(ctx context.Context) (time.Duration, error) {
		return r.runtimeFirstOutput(ctx, r.rt, true, nil, nil)
	}
	bare := func(ctx context.Context) (time.Duration, error) {
		return r.runtimeFirstOutput(ctx, off, true, nil, nil)
	}
	createOn, createOff, err := r.retryingPairs(ctx, ScenarioJail, n, "jailed", on, "unjailed", bare)
	if err != nil {
		return Result{}, err
	}

	// One sandbox of each kind for the exec round trips.
	jailed, err := r.rt.Create(ctx, sandbox.Spec{Template: r.cfg.Template})
	if err != nil {
		return Result{}, err
	}
	defer destroy(jailed)
	unjailed, err := off.Create(ctx, sandbox.Spec{Template: r.cfg.Template})
	if err != nil {
		return Result{}, err
	}
	defer destroy(unjailed)
	execIn := func(sb *sandbox.Sandbox) measure {
		return timed(func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, execTimeout)
			defer cancel()
			return runInSandbox(ctx, sb, []string{"true"}, nil)
		})
	}
	if _, _, err := timePairs(ctx, execWarmup, execIn(jailed), execIn(unjailed), nil); err != nil {
		return Result{}, fmt.Errorf("warm up: %w", err)
	}
	m := max(10, r.cfg.ExecRuns/2)
	da, db, err := timePairs(ctx, m, execIn(jailed), execIn(unjailed), nil)
	if err != nil {
		return Result{}, err
	}
	execOn, execOff := summarize(da), summarize(db)
	r.progressf("%s: exec round trip jailed %.2f ms, unjailed %.2f ms (p50)", ScenarioJail, execOn.P50, execOff.P50)

	// The image tools: a save of each sandbox's disk (qemu-img, e2fsck,
	// debugfs, resize2fs, dumpe2fs jailed as the VM's user, against the
	// same unconfined), and the template's configuration written into a
	// copy of the template image (resize2fs, debugfs, e2fsck jailed as a
	// build's user, against unconfined): the host's side of a build step.
	work, err := r.rt.Templates().TempDir("bench-jail")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(work)
	saveOf := func(sb *sandbox.Sandbox) measure {
		return timed(func(ctx context.Context) error {
			dst := filepath.Join(work, "saved-"+sb.ID+".ext4")
			defer os.Remove(dst)
			return sb.SaveDisk(ctx, dst)
		})
	}
	k := max(3, n)
	sa, sb, err := timePairs(ctx, k, saveOf(jailed), saveOf(unjailed), nil)
	if err != nil {
		return Result{}, fmt.Errorf("saves: %w", err)
	}
	saveOn, saveOff := summarize(sa), summarize(sb)
	r.progressf("%s: save jailed %.0f ms, unjailed %.0f ms (p50)", ScenarioJail, saveOn.P50, saveOff.P50)
	// Only the writing is timed, not the copy of the image it is made on.
	configIn := func(rt *sandbox.Runtime, name string) measure {
		return func(ctx context.Context) (time.Duration, error) {
			dir := filepath.Join(work, name)
			if err := os.Mkdir(dir, 0o755); err != nil {
				return 0, err
			}
			defer os.RemoveAll(dir)
			img := filepath.Join(dir, "disk.ext4")
			if out, err := exec.CommandContext(ctx, "cp", "--sparse=always", r.tpl.Image, img).CombinedOutput(); err != nil {
				return 0, fmt.Errorf("copy the template image: %v: %s", err, out)
			}
			if err := os.Chmod(img, 0o644); err != nil { // the stored image is read-only
				return 0, err
			}
			start := time.Now()
			tools, release, err := rt.BuildTools(dir)
			if err != nil {
				return 0, err
			}
			defer release()
			if err := tools.Own(img); err != nil {
				return 0, err
			}
			err = sandbox.WriteImageConfig(ctx, tools, img, []byte(`{"working_dir": "/srv/app"}`+"\n"), "/srv/app")
			return time.Since(start), err
		}
	}
	ca, cb, err := timePairs(ctx, k, configIn(r.rt, "jailed"), configIn(off, "unjailed"), nil)
	if err != nil {
		return Result{}, fmt.Errorf("image configuration: %w", err)
	}
	confOn, confOff := summarize(ca), summarize(cb)
	r.progressf("%s: image configuration jailed %.0f ms, unjailed %.0f ms (p50)", ScenarioJail, confOn.P50, confOff.P50)
	res := jailResult(createOn, createOff, execOn, execOff, saveOn, saveOff, confOn, confOff)
	res.Notes = fmt.Sprintf("airlock: a create of template %s from its snapshot to the first stdout byte of %v with the jail "+
		"on (own user, mount namespace, no capabilities, no_new_privs, QEMU's seccomp sandbox, cgroup, the "+
		"memory file as a sealed copy); baseline: the same through a runtime with the jail off; %d samples each, "+
		"alternating; ratio of p50s (p50 difference %+.0f ms). Variants, each with its own baseline: exec of true, "+
		"%d round trips each in one jailed and one unjailed sandbox, alternating (jailed p50 %.2f ms, unjailed %.2f ms); "+
		"a save of each one's disk, %d each, its image tools jailed as the VM's user against unconfined "+
		"(p50 %.0f ms against %.0f ms); the template's configuration written into a copy of the template "+
		"image, %d each, the tools jailed as a build's user against unconfined (p50 %.0f ms against %.0f ms)",
		r.tpl.Ref(), firstOutputArgv, n, createOn.P50-createOff.P50, m, execOn.P50, execOff.P50,
		k, saveOn.P50, saveOff.P50, k, confOn.P50, confOff.P50)
	return res, nil
}

// jailResult assembles jail_cost's result: the create with the jail on
// against it off, and each variant, jailed, against its own unjailed
// baseline, never the create's.
func jailResult(createOn, createOff, execOn, execOff, saveOn, saveOff, confOn, confOff Measurement) Result {
	return Result{
		Name:     ScenarioJail,
		Unit:     "ms",
		Airlock:  createOn,
		Baseline: createOff,
		Ratio:    ratio(createOn.P50, createOff.P50),
		Variants: []Variant{
			{Name: "exec_rtt_jailed_vs_unjailed", Measurement: execOn, Baseline: &execOff, Ratio: ratio(execOn.P50, execOff.P50)},
			{Name: "save_tools_jailed_vs_unjailed", Measurement: saveOn, Baseline: &saveOff, Ratio: ratio(saveOn.P50, saveOff.P50)},
			{Name: "image_config_tools_jailed_vs_unjailed", Measurement: confOn, Baseline: &confOff, Ratio: ratio(confOn.P50, confOff.P50)},
		},
	}
}
