// Package localpg runs a throwaway PostgreSQL cluster on this host with
// Debian's server binaries: made with initdb in a temporary directory,
// served on a loopback port, with one superuser (User) whose password only
// its maker knows. As root it runs as the postgres user, since PostgreSQL
// refuses to run as root. Its settings trade durability for speed (no
// fsync): it is for tests and the bench, never for data that matters.
package localpg

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/airlockhq/airlock/internal/ids"
)

// Cluster is a running throwaway cluster.
type Cluster struct {
	dir      string
	bin      string
	cred     *syscall.Credential
	port     int
	password string
	cmd      *exec.Cmd
	exited   chan struct{}
}

// User is the superuser of a cluster.
const User = "airlock"

// ErrNoServer says that this host lacks PostgreSQL's server binaries.
var ErrNoServer = errors.New("no PostgreSQL server binaries (initdb, postgres) under /usr/lib/postgresql/*/bin: apt-get install postgresql")

// postgresBin returns the directory of the newest installed server binaries.
func postgresBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", ErrNoServer
}

// Start makes and starts a cluster; Stop stops it and removes its files.
// A host without the server binaries gets ErrNoServer.
func Start() (*Cluster, error) {
	bin, err := postgresBin()
	if err != nil {
		return nil, err
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("PostgreSQL will not run as root and there is no postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	// The postgres user must reach the directory: as root, under /tmp,
	// which every user may traverse, not under a private $TMPDIR.
	parent := ""
	if cred != nil {
		parent = "/tmp"
	}
	dir, err := os.MkdirTemp(parent, "airlock-pg-")
	if err != nil {
		return nil, err
	}
	p := &Cluster{dir: dir, bin: bin, cred: cred, password: ids.Secret()}
	if err := p.initdb(); err != nil {
		p.Stop()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		p.Stop()
		return nil, err
	}
	p.port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	if err := p.launch(); err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}

// command is a command of the server's binaries, run as its user.
func (p *Cluster) command(name string, args ...string) *exec.Cmd {
	c := exec.Command(filepath.Join(p.bin, name), args...)
	c.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred, Setpgid: true}
	c.Env = []string{"LC_ALL=C.UTF-8", "PATH=/usr/bin:/bin"}
	return c
}

func (p *Cluster) initdb() error {
	cred := p.cred
	if cred != nil {
		if err := os.Chown(p.dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return err
		}
	}
	pwfile := filepath.Join(p.dir, "pw")
	if err := os.WriteFile(pwfile, []byte(p.password+"\n"), 0o600); err != nil {
		return err
	}
	if cred != nil {
		os.Chown(pwfile, int(cred.Uid), int(cred.Gid))
	}
	data := filepath.Join(p.dir, "data")
	init := p.command("initdb", "--pgdata", data, "--username", User, "--pwfile", pwfile,
		"--auth-host", "scram-sha-256", "--auth-local", "scram-sha-256", "--encoding", "UTF8", "--no-sync")
	if out, err := init.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %v: %s", err, out)
	}
	os.Remove(pwfile)
	return nil
}

// launch starts the server on the cluster and waits until it answers.
func (p *Cluster) launch() error {
	data := filepath.Join(p.dir, "data")
	p.exited = make(chan struct{})
	logf, err := os.Create(filepath.Join(p.dir, "postgres.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	p.cmd = p.command("postgres", "-D", data, "-p", strconv.Itoa(p.port), "-k", p.dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
		"-c", "full_page_writes=off", "-c", "max_connections=300", "-c", "shared_buffers=32MB")
	// If the test binary dies, so does the cluster.
	p.cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	go func() { p.cmd.Wait(); close(p.exited) }()

	db, err := sql.Open("pgx", p.URL("postgres"))
	if err != nil {
		return err
	}
	defer db.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := db.PingContext(ctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-p.exited:
			log, _ := os.ReadFile(filepath.Join(p.dir, "postgres.log"))
			return fmt.Errorf("postgres exited at start: %s", log)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres on port %d not ready in 30 s: %w", p.port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// URL returns the address of database db as the superuser.
func (p *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/%s?sslmode=disable", User, p.password, p.port, db)
}

// Dir returns the directory that holds the cluster's files.
func (p *Cluster) Dir() string { return p.dir }

// CreateDatabase creates an empty database with a new name and returns
// the name; DropDatabase drops it.
func (p *Cluster) CreateDatabase() (string, error) {
	name := ids.New("db")
	return name, p.Exec("postgres", "CREATE DATABASE "+name)
}

// DropDatabase drops database name, ending its sessions.
func (p *Cluster) DropDatabase(name string) error {
	return p.Exec("postgres", "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
}

// Exec runs a statement as the superuser in database db.
func (p *Cluster) Exec(db, query string, args ...any) error {
	c, err := sql.Open("pgx", p.URL(db))
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Exec(query, args...); err != nil {
		return fmt.Errorf("%s: %w", query, err)
	}
	return nil
}

// Down stops the server, keeping its files: a fast shutdown, which ends
// every client's connection (an immediate one could lose the last commits,
// which synchronous_commit=off does not wait for). Up starts it again on
// the same port.
func (p *Cluster) Down() {
	if p.cmd != nil && p.cmd.Process != nil {
		p.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.exited
		}
		p.cmd = nil
	}
}

// Up starts a server stopped by Down.
func (p *Cluster) Up() error { return p.launch() }

// Stop stops the cluster at once and removes its files.
func (p *Cluster) Stop() {
	p.Down()
	os.RemoveAll(p.dir)
}

// Available says whether this host has PostgreSQL's server binaries:
// nil, or ErrNoServer.
func Available() error {
	_, err := postgresBin()
	return err
}
