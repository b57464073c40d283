package vm

import (
	"context"
	"os"
	"testing"
)

func BenchmarkToolTrue(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("root")
	}
	for _, uid := range []int{0, toolTestUID} {
		b.Run(map[int]string{0: "unjailed", toolTestUID: "jailed"}[uid], func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if _, err := (Tool{Path: "/bin/true", UID: uid, GID: uid}).Output(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
