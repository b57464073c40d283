module github.com/airlockhq/airlock

go 1.26.0

require (
	github.com/cavaliergopher/cpio v1.0.1
	github.com/creack/pty v1.1.24
	github.com/hashicorp/yamux v0.1.2
	github.com/pierrec/lz4/v4 v4.1.33
	golang.org/x/sys v0.50.0
	golang.org/x/term v0.48.0
)
