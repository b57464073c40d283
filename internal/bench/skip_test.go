package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/datadir"
)

func TestSkips(t *testing.T) {
	dir := datadir.Dir{Root: "/nonexistent/airlock"}
	noNode := errors.New("node is not installed")
	tests := []struct {
		name  string
		cfg   Config
		lacks lacks
		want  []string // the scenarios skipped, in order
	}{
		{"every scenario, nothing lacking", Config{Dir: dir}, lacks{}, nil},
		{"every scenario, no Kubernetes binaries", Config{Dir: dir}, lacks{kube: kubeLack(Config{Dir: dir})},
			[]string{ScenarioClusterCreate, ScenarioClusterExecRTT, ScenarioClusterCreates}},
		{"every scenario, no node", Config{Dir: dir, KubeBin: "/kube"}, lacks{e2b: noNode},
			[]string{ScenarioE2BCreate, ScenarioE2BExecRTT}},
		{"every scenario, no base template", Config{Dir: dir, KubeBin: "/kube"}, lacks{base: errors.New("no base"), net: errors.New("no base")},
			[]string{ScenarioNetThroughput, ScenarioNetConnect, ScenarioNetDNS, ScenarioNetHTTPKeepAlive, ScenarioNetHTTPConnect,
				ScenarioE2BCreate, ScenarioE2BExecRTT}},
		{"every scenario, lacking the rest", Config{Dir: dir, KubeBin: "/kube"},
			lacks{postgres: errors.New("no postgres"), busybox: errors.New("no busybox"), jail: errors.New("unjailed"), ci: errors.New("no code-interpreter")},
			[]string{ScenarioWarmTemplate, ScenarioRunCodeRTT, ScenarioJail, ScenarioImageCreate, ScenarioPGCreate, ScenarioPGExecRTT}},
		// Named scenarios run, and fail saying what they lack.
		{"named scenarios are never skipped", Config{Dir: dir, Scenarios: []string{ScenarioE2BCreate, ScenarioBoot}},
			lacks{kube: errNoKube, e2b: noNode}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.cfg.skips(tt.lacks)
			var names []string
			for _, k := range got {
				names = append(names, k.Name)
				if k.Reason == "" || k.Reason != tt.lacks.why(k.Name).Error() {
					t.Errorf("%s skipped for %q, want %q", k.Name, k.Reason, tt.lacks.why(k.Name))
				}
				if !skipped(got, k.Name) {
					t.Errorf("skipped(%s) = false", k.Name)
				}
			}
			if !slices.Equal(names, tt.want) {
				t.Errorf("skipped %v, want %v", names, tt.want)
			}
			if skipped(got, ScenarioBoot) {
				t.Error("boot, which needs nothing but setup, was skipped")
			}
		})
	}
}

// `airlock bench` with no flags and no AIRLOCK_KUBE_BIN: the
// configuration is valid, the cluster_ scenarios are skipped with what to
// do about it, and the report says so in JSON and in the table.
func TestEveryScenarioWithoutKubeBinSkipsTheClusterOnes(t *testing.T) {
	cfg := Config{Dir: datadir.Dir{Root: "/nonexistent/airlock"}}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate() = %v, want nil: the cluster_ scenarios are skipped, not refused", err)
	}
	if kubeLack(cfg) != errNoKube || kubeLack(Config{KubeBin: "/kube"}) != nil {
		t.Fatal("the Kubernetes binaries' lack does not follow KubeBin")
	}
	skips := cfg.skips(lacks{kube: kubeLack(cfg)})
	if len(skips) != 3 {
		t.Fatalf("skipped %+v, want the 3 cluster_ scenarios", skips)
	}
	for _, k := range skips {
		if !strings.Contains(k.Reason, "run make bench or pass --kube-bin") {
			t.Errorf("%s skipped for %q, which does not say to run make bench or pass --kube-bin", k.Name, k.Reason)
		}
	}
	rep := Report{Version: ReportVersion, Results: []Result{}, Skipped: skips}
	var js bytes.Buffer
	if err := WriteJSON(&js, rep); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back.Skipped, skips) {
		t.Errorf("JSON skipped = %+v, want %+v", back.Skipped, skips)
	}
	var tab bytes.Buffer
	if err := WriteTable(&tab, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tab.String(), "skipped cluster_exec_rtt: no Kubernetes binaries: run make bench or pass --kube-bin") {
		t.Errorf("the table does not say what was skipped and why:\n%s", tab.String())
	}
}
