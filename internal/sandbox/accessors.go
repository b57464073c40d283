package sandbox

import "github.com/airlockhq/airlock/internal/timings"

// The methods below read what a Sandbox's fields and its Machine say, so
// that a consumer can hold a live VM behind an interface of its own (the
// service's VM) and a test can stand in for it.

// SandboxID is the sandbox's ID (the field ID).
func (s *Sandbox) SandboxID() string { return s.ID }

// MemoryMiB is the memory the sandbox's VM was given (Spec.MemoryMiB).
func (s *Sandbox) MemoryMiB() int { return s.Spec.MemoryMiB }

// StepTimings are the steps Create or Wake took (the field Timings).
func (s *Sandbox) StepTimings() timings.Timings { return s.Timings }

// Done is closed when the sandbox's VM has ended (Machine().Done()).
func (s *Sandbox) Done() <-chan struct{} { return s.vm.Done() }

// Exited reports whether the sandbox's VM has ended (Machine().Exited()).
func (s *Sandbox) Exited() bool { return s.vm.Exited() }
