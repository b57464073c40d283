package bench

import (
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/airlockhq/airlock/internal/localpg"
	"github.com/airlockhq/airlock/internal/sandbox"
)

// A run of every scenario (Config.Scenarios empty) leaves out those this
// host cannot run, and says which and why: the report's Skipped, a
// progress line each, and the table's last lines. A scenario named in
// Config.Scenarios is never skipped: it runs, and fails saying what it
// lacks.

// Skip is a scenario a run of every scenario left out.
type Skip struct {
	// Name is the scenario: one of Scenarios().
	Name string `json:"name"`
	// Reason says what this host lacks for it and how to give it that.
	Reason string `json:"reason"`
}

// lacks says, for each thing some scenarios need, why this host does not
// have it; nil where it does.
type lacks struct {
	kube     error // the Kubernetes binaries (Config.KubeBin): the cluster_ scenarios
	e2b      error // node and E2B's SDK: the e2b_ scenarios
	postgres error // PostgreSQL's server binaries: the postgres_ scenarios
	busybox  error // the host's static busybox: image_template_create_to_first_output
	net      error // root, python3 and template base: the net_ scenarios
	base     error // template base: the e2b_ scenarios
	jail     error // a jailed runtime: jail_cost
	ci       error // the code-interpreter template: warm_template_create, run_code_rtt
}

// errNoKube is why the cluster_ scenarios cannot run without
// Config.KubeBin.
var errNoKube = errors.New("no Kubernetes binaries: run make bench or pass --kube-bin DIR " +
	"(tools/kube/build.sh builds etcd, kube-apiserver and kube-scheduler and prints their directory)")

// kubeLack is why c cannot run the cluster_ scenarios, nil if it can.
func kubeLack(c Config) error {
	if c.KubeBin == "" {
		return errNoKube
	}
	return nil
}

// why is what name lacks on this host, nil if nothing.
func (l lacks) why(name string) error {
	switch name {
	case ScenarioClusterCreate, ScenarioClusterExecRTT, ScenarioClusterCreates:
		return l.kube
	case ScenarioE2BCreate, ScenarioE2BExecRTT:
		return errors.Join(l.base, l.e2b)
	case ScenarioPGCreate, ScenarioPGExecRTT:
		return l.postgres
	case ScenarioImageCreate:
		return l.busybox
	case ScenarioNetThroughput, ScenarioNetConnect, ScenarioNetDNS, ScenarioNetHTTPKeepAlive, ScenarioNetHTTPConnect:
		return l.net
	case ScenarioJail:
		return l.jail
	case ScenarioWarmTemplate, ScenarioRunCodeRTT:
		return l.ci
	}
	return nil
}

// skips lists the scenarios a run of c leaves out, in the order of
// Scenarios(): none when c names its scenarios, else every one that l
// says this host cannot run.
func (c *Config) skips(l lacks) []Skip {
	if len(c.Scenarios) > 0 {
		return nil
	}
	var out []Skip
	for _, name := range Scenarios() {
		if err := l.why(name); err != nil {
			out = append(out, Skip{Name: name, Reason: err.Error()})
		}
	}
	return out
}

// hostLacks finds what this host lacks for the scenarios that need more
// than a data directory after airlock setup, without starting anything.
func hostLacks(c Config, rt *sandbox.Runtime) lacks {
	l := lacks{kube: kubeLack(c)}
	if _, err := findE2BSDK(c.E2BSDK); err != nil {
		l.e2b = err
	}
	if err := localpg.Available(); err != nil {
		l.postgres = err
	}
	if _, err := busyboxImage(hostBusybox); err != nil {
		l.busybox = err
	}
	if _, err := rt.Templates().Resolve(e2bTemplate); err != nil {
		l.base = fmt.Errorf("template %s: %w (airlock setup makes it)", e2bTemplate, err)
	}
	if os.Geteuid() != 0 {
		l.net = errors.New("the network scenarios make a network namespace for their test host and need root")
	} else if _, err := hostPython(); err != nil {
		l.net = err
	} else if _, err := rt.Templates().Resolve(netTemplate); err != nil {
		l.net = fmt.Errorf("template %s: %w (airlock setup makes it)", netTemplate, err)
	}
	if !rt.Jailed() {
		l.jail = fmt.Errorf("%s needs the jail on, and this runtime runs its VMs unjailed", ScenarioJail)
	}
	if _, err := rt.Templates().Resolve(warmTemplateRef); err != nil {
		l.ci = fmt.Errorf("template %s: %w (airlock setup makes it)", warmTemplateRef, err)
	}
	return l
}

// skipped reports whether s names name.
func skipped(s []Skip, name string) bool {
	return slices.ContainsFunc(s, func(k Skip) bool { return k.Name == name })
}
