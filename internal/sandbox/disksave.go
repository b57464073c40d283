package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway"
	"github.com/airlockhq/airlock/internal/gateway/mitm"
	"github.com/airlockhq/airlock/internal/vm"
)

// A saved disk is a sandbox's root filesystem as a compact ext4 image, as
// a template is (mkfs.ext4 -d makes those): consistent, with its journal
// replayed, without what init wrote for the sandbox alone (guestFiles),
// and shrunk to the least its content needs. A running sandbox's guest
// freezes its filesystem while the disk is copied; a suspended sandbox's
// disk is at rest and is copied as it is.

// diskSave is what saving a disk took.
type diskSave struct {
	// Frozen is how long the guest's root filesystem was frozen, from the
	// freeze's answer to the thaw's: writers in the guest waited that long.
	Frozen time.Duration
	// Ran is how long the vCPUs of a paused sandbox ran, for the freeze and
	// the thaw.
	Ran time.Duration
	// Copy is how long the copy of the disk took, Total the whole save.
	Copy, Total time.Duration
	// Bytes is the size of the image written.
	Bytes int64
}

// thawTimeout bounds the thaw that ends a save, which runs even when the
// save's context has ended.
const thawTimeout = 30 * time.Second

// SaveDisk writes an ext4 image of the sandbox's root filesystem as it is
// now to dst (replaced whole, or left as it was on failure), for a
// template to be made of. The guest's filesystem is frozen (its writes
// flushed to the disk, new ones held) while the disk is copied, and
// thawed whatever happens. A paused sandbox runs only for the freeze and
// the thaw, and is paused again after each; its processes stay paused.
// The image is then checked, cleared of what init wrote for this sandbox
// (hostname, resolver, the gateway's CA), and shrunk to the least its
// content needs. A suspended Sandbox is errdefs.ErrConflict: see
// Runtime.SaveSuspendedDisk.
func (s *Sandbox) SaveDisk(ctx context.Context, dst string) error {
	_, err := s.saveDisk(ctx, dst)
	return err
}

func (s *Sandbox) saveDisk(ctx context.Context, dst string) (diskSave, error) {
	start := time.Now()
	var st diskSave
	fail := func(err error) (diskSave, error) {
		return st, fmt.Errorf("save the disk of sandbox %s: %w", s.ID, err)
	}
	rec, err := readRecord(s.Dir)
	if err != nil {
		return fail(err)
	}
	if len(rec.VM.Backing) == 0 {
		// Recorded before chains were: the template it was made from,
		// and the warm layer its record names.
		if s.Template.Image == "" {
			return fail(fmt.Errorf("its record predates recorded disk chains: suspend it and save it then: %w", errdefs.ErrPrecondition))
		}
		rec.VM.Backing = rec.chainOver(s.Template.Image)
	}
	tools, info, err := diskTools(rec)
	if err != nil {
		return fail(err)
	}
	g, err := s.guestFiles()
	if err != nil {
		return fail(err)
	}
	tmp, err := tools.tempBeside(dst)
	if err != nil {
		return fail(err)
	}
	defer os.Remove(tmp) // gone already once renamed
	if err := s.copyFrozen(ctx, tools, info, tmp, freezeTimeout(info), &st); err != nil {
		return fail(err)
	}
	if st.Bytes, err = finishImage(ctx, tools, tmp, info.base(), g); err != nil {
		return fail(err)
	}
	if err := tools.GiveBack(tmp); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fail(err)
	}
	st.Total = time.Since(start)
	s.log.Info("disk saved", "to", dst, "bytes", st.Bytes, "frozen", st.Frozen, "ran", st.Ran, "copy", st.Copy, "took", st.Total)
	return st, nil
}

// copyFrozen copies the sandbox's disk while its guest's root filesystem
// is frozen.
func (s *Sandbox) copyFrozen(ctx context.Context, tools ImageTools, info diskInfo, dst string, freezeFor time.Duration, st *diskSave) error {
	s.life.Lock()
	defer s.life.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	paused := s.Paused()
	guest := func(ctx context.Context, f func(context.Context, *agentclient.Client) error) error {
		return s.inGuest(ctx, paused, &st.Ran, f)
	}
	thaw := func() (agentproto.ThawResult, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), thawTimeout)
		defer cancel()
		var res agentproto.ThawResult
		err := guest(ctx, func(ctx context.Context, c *agentclient.Client) error {
			var err error
			res, err = c.Thaw(ctx)
			return err
		})
		return res, err
	}
	err := guest(ctx, func(ctx context.Context, c *agentclient.Client) error {
		return c.Freeze(ctx, freezeFor)
	})
	if unknownOp(err, agentproto.OpFreeze) {
		return fmt.Errorf("its guest agent predates freezing (the sandbox started before `airlock setup` installed a newer one): suspend it and save its disk then: %w", errdefs.ErrPrecondition)
	}
	if err != nil {
		// The freeze may have happened with only its answer lost: a thaw
		// does no harm either way.
		if _, terr := thaw(); terr != nil {
			err = errors.Join(err, terr)
		}
		return err
	}
	frozen := time.Now()
	err = copyOverlay(ctx, tools, info, dst)
	st.Copy = time.Since(frozen)
	res, terr := thaw()
	st.Frozen = time.Since(frozen)
	switch {
	case terr != nil:
		err = errors.Join(err, terr)
	case !res.Thawed && err == nil:
		err = fmt.Errorf("the guest's filesystem was thawed before the copy ended (its freeze ran out after %s of the guest's time, or a process in the sandbox thawed it): the copy may be inconsistent", freezeFor)
	}
	return err
}

// inGuest runs f with the agent while the guest runs: a paused sandbox
// (paused) is resumed for it, given a session with its agent if it has
// none (it was adopted paused), and paused again after, whatever f did;
// the time its vCPUs ran is added to ran. Errors from the VM going away
// are explained.
func (s *Sandbox) inGuest(ctx context.Context, paused bool, ran *time.Duration, f func(context.Context, *agentclient.Client) error) error {
	if !paused {
		c, err := s.session()
		if err != nil {
			return err
		}
		return s.explain(f(ctx, c))
	}
	t := time.Now()
	if err := s.vm.Resume(ctx); err != nil {
		return fmt.Errorf("resume the paused vm: %w", s.vmErr(err))
	}
	err := func() error {
		c := s.Agent()
		if c == nil {
			if err := s.connect(ctx); err != nil {
				return s.vmErr(err)
			}
			c = s.Agent()
		}
		return s.explain(f(ctx, c))
	}()
	if perr := s.vm.Pause(ctx); perr != nil {
		err = errors.Join(err, fmt.Errorf("pause the vm again: %w", s.vmErr(perr)))
	}
	if ran != nil {
		*ran += time.Since(t)
	}
	return err
}

// guestFiles describes what init wrote for this sandbox.
func (s *Sandbox) guestFiles() (guestFiles, error) {
	s.mu.Lock()
	ca := s.ca
	s.mu.Unlock()
	if ca == nil {
		return recordedGuestFiles(s.Dir, s.ID)
	}
	return guestFiles{Hostname: s.ID, Gateway: gateway.GatewayIP, CACert: ca.CertPEM()}, nil
}

// recordedGuestFiles describes what init wrote for sandbox id, whose
// directory is dir, from its record and its gateway's CA there.
func recordedGuestFiles(dir, id string) (guestFiles, error) {
	g := guestFiles{Hostname: id}
	rec, err := readRecord(dir)
	if err != nil || rec.VM.NetMAC == "" {
		return g, nil // no network device: init wrote no network files
	}
	g.Gateway = gateway.GatewayIP
	caDir := filepath.Join(dir, gatewayDirName)
	if _, err := os.Stat(caDir); err != nil {
		return g, nil
	}
	ca, err := mitm.LoadOrCreateCA(caDir, caName(id))
	if err != nil {
		return g, fmt.Errorf("the sandbox's CA: %w", err)
	}
	g.CACert = ca.CertPEM()
	return g, nil
}

// SaveSuspendedDisk writes an ext4 image of the root filesystem of
// suspended sandbox id to dst, as Sandbox.SaveDisk does for a live one.
// The disk is at rest (Suspend had the guest write its data out first);
// the sandbox is held (Wake waits) only while it is copied. A sandbox
// that is not suspended is errdefs.ErrPrecondition, one that does not
// exist errdefs.ErrNotFound, one that a live process owns
// errdefs.ErrConflict.
func (r *Runtime) SaveSuspendedDisk(ctx context.Context, id, dst string) error {
	_, err := r.saveSuspendedDisk(ctx, id, dst)
	return err
}

func (r *Runtime) saveSuspendedDisk(ctx context.Context, id, dst string) (diskSave, error) {
	start := time.Now()
	var st diskSave
	if !ValidID(id) {
		return st, invalidID(id)
	}
	fail := func(err error) (diskSave, error) {
		return st, fmt.Errorf("save the disk of sandbox %s: %w", id, err)
	}
	dir := r.cfg.Dir.Sandbox(id)
	lock, err := lockOwner(dir)
	if errors.Is(err, os.ErrNotExist) {
		return fail(fmt.Errorf("it does not exist: %w", errdefs.ErrNotFound))
	}
	if err != nil {
		return fail(err)
	}
	defer lock.Close()
	if !SuspendedState(dir) {
		return fail(fmt.Errorf("it is not suspended: save a live sandbox's disk through its Sandbox: %w", errdefs.ErrPrecondition))
	}
	rec, err := readRecord(dir)
	if err != nil {
		return fail(err)
	}
	if rec.VM.Backing, err = r.backing(rec); err != nil {
		return fail(err)
	}
	tools, info, err := diskTools(rec)
	if err != nil {
		return fail(err)
	}
	g, err := recordedGuestFiles(dir, id)
	if err != nil {
		return fail(err)
	}
	tmp, err := tools.tempBeside(dst)
	if err != nil {
		return fail(err)
	}
	defer os.Remove(tmp)
	t := time.Now()
	err = copyOverlay(ctx, tools, info, tmp)
	st.Copy = time.Since(t)
	lock.Close()
	if err != nil {
		return fail(err)
	}
	if st.Bytes, err = finishImage(ctx, tools, tmp, info.base(), g); err != nil {
		return fail(err)
	}
	if err := tools.GiveBack(tmp); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fail(err)
	}
	st.Total = time.Since(start)
	r.log.Info("disk of a suspended sandbox saved", "sandbox", id, "to", dst, "bytes", st.Bytes, "copy", st.Copy, "took", st.Total)
	return st, nil
}

// diskInfo is what the server knows of a sandbox's disk: the overlay and
// the chain of images under it as it made them (record.VM.Backing),
// nearest first, the template image last.
type diskInfo struct {
	overlay   string
	backing   []string
	allocated int64 // bytes the overlay (and a warm snapshot's layer under it) take on the host
	baseSize  int64 // bytes of the template image
}

// base is the template image at the bottom of the chain.
func (d diskInfo) base() string { return d.backing[len(d.backing)-1] }

// diskTools returns the tools that work on the disk of the sandbox rec
// records, jailed as its VM's user (none when it runs unjailed), and what
// they are to read. Sizes come from the host's files, the chain from the
// record: no qcow2 header the VM could have written is trusted for
// either.
func diskTools(rec record) (ImageTools, diskInfo, error) {
	var tools ImageTools
	if rec.VM.Jail != nil {
		tools.uid = rec.VM.Jail.UID
	}
	info := diskInfo{overlay: rec.VM.Disk, backing: rec.VM.Backing}
	if info.overlay == "" || len(info.backing) == 0 {
		return tools, info, fmt.Errorf("the sandbox's record names no disk and backing chain")
	}
	for i, f := range append([]string{info.overlay}, info.backing...) {
		fi, err := os.Stat(f)
		if err != nil {
			return tools, info, fmt.Errorf("the sandbox's disk: %w", err)
		}
		if i == len(info.backing) {
			info.baseSize = fi.Size()
		} else if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			info.allocated += st.Blocks * 512
		}
	}
	return tools, info, nil
}

// freezeTimeout is the deadline of the freeze for copying a disk: a
// minute plus the time to read all it holds at a slow 16 MiB/s.
func freezeTimeout(info diskInfo) time.Duration {
	d := time.Minute + time.Duration((info.allocated+info.baseSize)>>24)*time.Second
	return min(d, agentproto.MaxFreeze)
}

// copyOverlay writes the whole disk (overlay, a warm snapshot's layer and
// template image: the backing chain flattened) to dst as a raw image; -U
// reads it while QEMU holds it. The chain is given to qemu-img in full
// (--image-opts), so the backing names in the qcow2 headers are not
// followed, and its jail shows it no other image.
func copyOverlay(ctx context.Context, tools ImageTools, info diskInfo, dst string) error {
	_, err := tools.output(ctx, "qemu-img", append([]string{info.overlay}, info.backing...), []string{dst},
		"convert", "-U", "--image-opts", chainOpts(info), "-O", "raw", dst)
	return err
}

// chainOpts is qemu-img's --image-opts for the overlay over its chain: a
// qcow2 node for the overlay, then vm.BackingOpts.
func chainOpts(info diskInfo) string {
	return "driver=qcow2,file.driver=file,file.filename=" + strings.ReplaceAll(info.overlay, ",", ",,") + vm.BackingOpts(info.backing)
}

// finishImage makes the raw copy of a sandbox's disk at img a template
// image: its journal replayed and the filesystem checked, what init wrote
// for the sandbox removed (base is the template the disk was made from),
// shrunk to its minimum and the file cut to the filesystem's end. It
// returns the file's size.
func finishImage(ctx context.Context, tools ImageTools, img, base string, g guestFiles) (int64, error) {
	if err := fsck(ctx, tools, img); err != nil {
		return 0, err
	}
	if err := removeGuestFiles(ctx, tools, img, base, g); err != nil {
		return 0, fmt.Errorf("remove the sandbox's own files: %w", err)
	}
	if err := fsck(ctx, tools, img); err != nil {
		return 0, err
	}
	// -f: the check resize2fs asks for was just made, but it goes by the
	// guest's clock, which may run ahead of the host's.
	if _, err := tools.output(ctx, "resize2fs", nil, []string{img}, "-f", "-M", img); err != nil {
		return 0, err
	}
	size, err := fsSize(ctx, tools, img)
	if err != nil {
		return 0, err
	}
	if err := os.Truncate(img, size); err != nil {
		return 0, err
	}
	return size, nil
}

// fsck checks and repairs the filesystem in img, replaying its journal.
// e2fsck's exit codes 1 and 2 say it fixed something, which a copy of a
// mounted filesystem needs (its orphans, at least).
//
// A filesystem e2fsck cannot repair (its exit code 4 and up: errors left,
// or a superblock it could not use) is the guest's doing, not the
// host's, and a state of the sandbox that does not allow a save:
// errdefs.ErrConflict, with e2fsck's own words.
func fsck(ctx context.Context, tools ImageTools, img string) error {
	_, err := tools.output(ctx, "e2fsck", nil, []string{img}, "-f", "-y", img)
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ee.ExitCode() <= 2 {
			return nil
		}
		if ee.ExitCode() > 0 && ee.ExitCode()&4 != 0 {
			return fmt.Errorf("the sandbox's root filesystem is damaged beyond what e2fsck repairs: %w: %w", err, errdefs.ErrConflict)
		}
	}
	return err
}

var (
	blockCountRE = regexp.MustCompile(`(?m)^Block count:\s+(\d+)$`)
	blockSizeRE  = regexp.MustCompile(`(?m)^Block size:\s+(\d+)$`)
)

// fsSize is the size of the ext4 filesystem in img, from its superblock.
func fsSize(ctx context.Context, tools ImageTools, img string) (int64, error) {
	out, err := tools.output(ctx, "dumpe2fs", []string{img}, nil, "-h", img)
	if err != nil {
		return 0, err
	}
	c, s := blockCountRE.FindSubmatch(out), blockSizeRE.FindSubmatch(out)
	if c == nil || s == nil {
		return 0, fmt.Errorf("dumpe2fs -h %s: no block count and size", img)
	}
	count, _ := strconv.ParseInt(string(c[1]), 10, 64)
	size, _ := strconv.ParseInt(string(s[1]), 10, 64)
	return count * size, nil
}

// toolPath finds a host tool of e2fsprogs or qemu-utils, which airlock
// setup installs. e2fsprogs' live in sbin directories, which a user's
// PATH may lack.
func toolPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	pkg := "e2fsprogs"
	if name == "qemu-img" {
		pkg = "qemu-utils"
	}
	return "", fmt.Errorf("%s is not installed (package %s): run `airlock setup` as root: %w", name, pkg, errdefs.ErrPrecondition)
}
