package sandbox

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/template"
)

// A warm template snapshot is taken with the template's start command up,
// so that a clone starts with its server running and no sandbox waits for
// it. The template VM is initialised as a sandbox is, under a placeholder
// identity (warmHostname, a gateway that denies all egress and whose CA
// is thrown away), on a disk of warmDiskMiB; the start command is started
// and its readiness checked as startTemplate does for every sandbox
// otherwise; the guest writes its data out, and the state is saved as for
// a cold snapshot. The disk the template VM wrote stays in the snapshot's
// directory as its disk layer (layerName), read-only from then on: a
// clone's disk is a qcow2 overlay of it, itself an overlay of the
// template image. A clone is restored, then reinit (agentproto.OpReinit)
// replaces the placeholder identity by the sandbox's (clock, entropy,
// hostname, CA, environment, disk size), and one readiness check of the
// server it came with (checkServer) stands in for the start.
//
// Processes of the snapshot share their user-space state across clones:
// what the server drew from its random generator at start, its keys and
// its memory layout are the same in every clone; the kernel's random
// generator is reseeded, and hostname and CA are each clone's own.

// warmHostname is the hostname of a warm snapshot's template VM, which a
// clone's reinit replaces.
const warmHostname = "airlock-template"

// warmDiskHeadroomMiB is how much larger than its template's image a warm
// snapshot's disk is, for what the start command writes: a template image
// may have no free space at all (a saved disk is shrunk to its content).
const warmDiskHeadroomMiB = 256

// warmCheckTimeout bounds the readiness check of a warm clone's server.
// It is up already and answers the first try (in tens of milliseconds
// under TCG); the bound is for a busy host, where a check that gives up
// too soon would have a good snapshot made again.
const warmCheckTimeout = 30 * time.Second

// warmTemplate reports whether tpl can have a warm snapshot: it has no
// server to start, or a way to tell when its server is ready. A template
// with a start command and no readiness check cannot: its clones start
// their server themselves, from the cold snapshot.
func warmTemplate(tpl template.Template) bool {
	return !hasServer(tpl) || tpl.ReadyCmd != "" || tpl.ReadyPort != 0
}

// hasServer reports whether a sandbox of tpl starts a server: it has a
// start command, or a readiness check that waits for one.
func hasServer(tpl template.Template) bool {
	return tpl.StartCmd != "" || tpl.ReadyCmd != "" || tpl.ReadyPort != 0
}

// minDiskMiB is the least disk a sandbox of tpl can have: its image.
func minDiskMiB(tpl template.Template) int {
	return int((tpl.SizeBytes + (1<<20 - 1)) >> 20)
}

// warmDiskMiB is the size of the disk of tpl's warm snapshot: its image
// and up to warmDiskHeadroomMiB more, no more than the template's default
// disk. A clone's disk cannot be smaller.
func warmDiskMiB(tpl template.Template) int {
	least := minDiskMiB(tpl)
	return max(least, min(tpl.DiskMiB, least+warmDiskHeadroomMiB))
}

// startsWarm reports whether a sandbox of the resolved spec is a clone of
// its template's warm snapshot: the template can have one, its disk is
// no smaller than the snapshot's, and, for a template with a server, the
// sandbox would start it as the snapshot's was started. One that skips
// the start command (Spec.NoStart) or whose server must see its own
// environment (Spec.Env) is a clone of the cold snapshot and starts its
// server itself. A template without a server has nothing started: the
// environment is the default of the sandbox's commands, which reinit
// sets.
func startsWarm(spec Spec, tpl template.Template) bool {
	if !warmTemplate(tpl) || spec.DiskMiB < warmDiskMiB(tpl) {
		return false
	}
	return !hasServer(tpl) || !spec.NoStart && len(spec.Env) == 0
}

// warmStartID identifies what a warm snapshot of tpl depends on beyond its
// image: the start settings, and the size of the disk the server ran on.
// The settings of a stored image can change; its snapshot then does.
func warmStartID(tpl template.Template) string {
	h := sha256.New()
	for _, f := range []string{tpl.StartCmd, tpl.ReadyCmd, strconv.Itoa(tpl.ReadyPort), tpl.ReadyPath, strconv.Itoa(warmDiskMiB(tpl))} {
		h.Write([]byte(f))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:8]
}

// Disk layers of warm snapshots are named by the making's ID: a clone's
// overlay names its layer by path, and a remade snapshot must not put
// other content under that path.
const (
	layerPrefix = "disk-"
	layerSuffix = ".qcow2"
)

// layerName is the disk layer's file name of the making id.
func layerName(id string) string { return layerPrefix + id + layerSuffix }

// isLayerName reports whether name is one layerName makes.
func isLayerName(name string) bool {
	id, ok := strings.CutPrefix(name, layerPrefix)
	id, ok2 := strings.CutSuffix(id, layerSuffix)
	return ok && ok2 && id != "" && !strings.ContainsAny(id, "/.")
}

// warmSteps initialise the template VM tvm (its gateway started, its
// agent connected, waiting for init) like a sandbox under the placeholder
// identity, start its template's server and wait until it is ready, and
// have the guest write its data out.
func (r *Runtime) warmSteps(tvm *Sandbox) []step {
	return []step{
		{"init template vm", func(ctx context.Context) error {
			entropy := make([]byte, 64)
			rand.Read(entropy)
			res, err := tvm.agent.Init(ctx, agentproto.InitRequest{
				Hostname: warmHostname, TimeUnixNano: time.Now().UnixNano(), Entropy: entropy,
				RootDevice: "/dev/vda", Network: tvm.guestNetwork(), Placeholder: true,
			})
			if err != nil {
				return tvm.explain(err)
			}
			for _, w := range res.Warnings {
				tvm.log.Warn("the template VM's init went on without something", "warning", w)
			}
			pong, err := tvm.agent.Ping(ctx)
			if err != nil {
				return tvm.explain(err)
			}
			if !pong.Placeholder {
				// Its clones could not be given their own identity.
				return errors.New("the guest agent predates warm snapshots (reinit): run `airlock setup`")
			}
			return nil
		}, nil},
		{"start template's server", func(ctx context.Context) error {
			return r.startTemplate(ctx, tvm, max(r.startTimeout(), warmStartTimeout))
		}, nil},
		{"write out guest data", func(ctx context.Context) error {
			// Not needed for the clones, whose RAM holds what the disk
			// lacks, but each would write the same dirty pages to its
			// own disk otherwise.
			ctx, cancel := context.WithTimeout(ctx, syncTimeout)
			defer cancel()
			return tvm.explain(tvm.agent.Sync(ctx))
		}, nil},
	}
}

// reinitStep makes the guest of a warm clone the sandbox: the host's
// clock, fresh entropy, the sandbox's ID as hostname, its gateway's CA,
// its environment, and its root filesystem grown to the disk's size.
func reinitStep(sb *Sandbox) step {
	return step{"reinit guest", func(ctx context.Context) error {
		entropy := make([]byte, 64)
		rand.Read(entropy)
		req := agentproto.ReinitRequest{
			Hostname: sb.ID, TimeUnixNano: time.Now().UnixNano(), Entropy: entropy,
			Env: sb.Spec.Env, DiskBytes: int64(sb.Spec.DiskMiB) << 20,
		}
		if n := sb.guestNetwork(); n != nil {
			req.CACert = n.CACert
		}
		res, err := sb.agent.Reinit(ctx, req)
		sb.Init = res
		for _, w := range res.Warnings {
			sb.log.Warn("the guest's reinit went on without something", "warning", w)
		}
		return sb.explain(err)
	}, nil}
}

// checkServer checks once that the template's server a warm clone came
// with answers as its readiness check says, trying for at most
// warmCheckTimeout: a clone whose server did not survive the restore
// fails clearly instead of being handed out.
func (r *Runtime) checkServer(ctx context.Context, sb *Sandbox) error {
	tpl := sb.Template
	var err error
	if tpl.ReadyCmd != "" {
		err = sb.waitReadyCmd(ctx, tpl.ReadyCmd, warmCheckTimeout)
	}
	if err == nil && tpl.ReadyPort != 0 {
		err = sb.waitReady(ctx, uint16(tpl.ReadyPort), tpl.ReadyPath, warmCheckTimeout)
	}
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("the server of the warm snapshot is not ready in the clone: %w; %s ends with:\n%s", err, template.StartLog, sb.startLog(ctx))
	}
	return err
}

// createLayeredOverlay makes a clone's disk of a warm snapshot: a qcow2
// overlay of its disk layer, of the layer's size, which QEMU opens
// read-only as a backing file.
func createLayeredOverlay(ctx context.Context, layer, path string, sizeMiB int) error {
	if sizeMiB <= 0 {
		return fmt.Errorf("the warm snapshot's layer %s has no recorded size", layer)
	}
	return qemuImgCreate(ctx, layer, "qcow2", path, int64(sizeMiB)<<20)
}

// layersInUse returns the disk layers (by path) that disks stand on, as
// the records say: each sandbox's in the data directory (its warm layer
// and its whole chain), and each checkpoint's chain, which sandboxes made
// from it later stand on too.
func (r *Runtime) layersInUse() (map[string]bool, error) {
	used := map[string]bool{}
	// Only the chain is read, so that no record a wake would refuse for
	// another reason costs a disk its layer.
	var rec struct {
		Layer string `json:"layer"`
		VM    struct {
			Backing []string `json:"backing"`
		} `json:"vm"`
		Backing []string `json:"backing"` // a checkpoint's
	}
	for _, root := range []struct{ dir, name string }{
		{r.cfg.Dir.Sandboxes(), RecordName},
		{r.cfg.Dir.Checkpoints(), checkpointRecordName},
	} {
		ents, err := os.ReadDir(root.dir)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			if !e.IsDir() {
				continue
			}
			rec.Layer, rec.VM.Backing, rec.Backing = "", nil, nil
			b, err := os.ReadFile(filepath.Join(root.dir, e.Name(), root.name))
			if err != nil || json.Unmarshal(b, &rec) != nil {
				continue
			}
			for _, p := range slices.Concat([]string{rec.Layer}, rec.VM.Backing, rec.Backing) {
				if p != "" {
					used[p] = true
				}
			}
		}
	}
	return used, nil
}

// carryLayers links into build, the new making of the snapshot at final,
// the disk layers of the one there (and of earlier makings it carried)
// that sandboxes' disks still stand on, so that they stay at the path
// their overlays name while the snapshot is replaced: a suspended clone's
// wake opens its disk again. The caller holds the snapshot's exclusive
// lock: no clone of the old making is between taking it and recording
// its layer.
func (r *Runtime) carryLayers(final, build string) error {
	old, _ := filepath.Glob(filepath.Join(final, layerPrefix+"*"+layerSuffix))
	if len(old) == 0 {
		return nil
	}
	used, err := r.layersInUse()
	if err != nil {
		return fmt.Errorf("find the disk layers sandboxes use: %w", err)
	}
	for _, p := range old {
		if !used[p] {
			continue
		}
		dst := filepath.Join(build, filepath.Base(p))
		if err := os.Link(p, dst); err != nil {
			return fmt.Errorf("keep the disk layer %s: %w", filepath.Base(p), err)
		}
	}
	return nil
}
