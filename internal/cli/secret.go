package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"golang.org/x/term"

	"github.com/airlockhq/airlock/internal/apiclient"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// maxSecretValue is the server's bound on a secret's value, checked here
// too so that a large file fails before anything is sent.
const maxSecretValue = 64 << 10

func secretCommands() []command {
	return []command{
		{"set", "store a secret, or replace its value", runSecretSet},
		{"ls", "list the secrets of the API key", runSecretList},
		{"rm", "remove secrets", runSecretRemove},
	}
}

func runSecret(ctx context.Context, env *Env, args []string) error {
	return runGroup(ctx, env, "secret",
		"Manages the secrets of an API key on an airlock server (`airlock serve`): values that a\n"+
			"sandbox's gateway sets in the requests its network policy's credentials name, which\n"+
			"never enter the sandbox. Each key sees only its own secrets.",
		secretCommands(), args)
}

const secretSetAbout = `Stores a secret under NAME for the API key, replacing the value of a secret
of that name, and prints whether it was created or replaced. NAME is 1 to 64
letters, digits, '_', '.' or '-'.

The value is read from stdin (without echo on a terminal), or from the file
--value-file names, and never from the command line: arguments are visible to
every user of this machine in ps and /proc. One trailing newline is dropped,
so "echo" and editors do not add one to the value. The value must be UTF-8
text of at most 64 KiB.

  airlock secret set openai < ~/.config/openai.key
  printenv OPENAI_API_KEY | airlock secret set openai
  airlock secret set --value-file ./token github`

func runSecretSet(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("secret set", "airlock secret set [FLAGS] NAME", secretSetAbout, env)
	sf := addServerFlags(fs)
	valueFile := fs.String("value-file", "", "read the value from `FILE` instead of stdin")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("secret set: give one NAME, e.g. `airlock secret set openai < key.txt`;"+
			" the value comes from stdin or --value-file, never the command line: %w", errdefs.ErrInvalid)
	}
	name := pos[0]
	value, err := readSecretValue(env, name, *valueFile)
	if err != nil {
		return err
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	_, created, err := c.PutSecret(ctx, apiv1.PutSecret{Name: name, Value: value})
	if err != nil {
		return err
	}
	verb := "replaced"
	if created {
		verb = "created"
	}
	fmt.Fprintf(env.Stdout, "secret %s %s\n", name, verb)
	return nil
}

// readSecretValue reads a value from file, or from stdin when file is "":
// at most maxSecretValue bytes of UTF-8 after one trailing newline is
// dropped. No error quotes the value.
func readSecretValue(env *Env, name, file string) (string, error) {
	var (
		b   []byte
		err error
	)
	switch {
	case file != "":
		var f *os.File
		if f, err = os.Open(file); err != nil {
			return "", fmt.Errorf("secret set: --value-file: %v: %w", err, errdefs.ErrInvalid)
		}
		defer f.Close()
		b, err = io.ReadAll(io.LimitReader(f, maxSecretValue+3))
	case env.Stdin != nil && term.IsTerminal(int(env.Stdin.Fd())):
		fmt.Fprintf(env.Stderr, "Value of secret %s (not shown): ", name)
		b, err = term.ReadPassword(int(env.Stdin.Fd()))
		fmt.Fprintln(env.Stderr)
	case env.Stdin != nil:
		b, err = io.ReadAll(io.LimitReader(env.Stdin, maxSecretValue+3))
	}
	if err != nil {
		return "", fmt.Errorf("secret set: read the value: %w", err)
	}
	if bytes.HasSuffix(b, []byte("\r\n")) {
		b = b[:len(b)-2]
	} else if bytes.HasSuffix(b, []byte("\n")) {
		b = b[:len(b)-1]
	}
	switch {
	case len(b) == 0:
		return "", fmt.Errorf("secret set: the value is empty: pipe it on stdin or give --value-file: %w", errdefs.ErrInvalid)
	case len(b) > maxSecretValue:
		return "", fmt.Errorf("secret set: the value is over %d bytes: %w", maxSecretValue, errdefs.ErrInvalid)
	case !utf8.Valid(b):
		// JSON would carry it with the bad bytes replaced: refuse instead.
		return "", fmt.Errorf("secret set: the value is not UTF-8 text (the API carries it as a JSON string): %w", errdefs.ErrInvalid)
	}
	return string(b), nil
}

const secretListAbout = `Lists the names of the API key's secrets, with when each was created and
last set, as a table or as a JSON array. Values are never shown. An admin
key too lists only its own secrets.

  airlock secret ls
  airlock secret ls --json | jq -r '.[].name'`

func runSecretList(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("secret ls", "airlock secret ls [FLAGS]", secretListAbout, env)
	sf := addServerFlags(fs)
	asJSON := fs.Bool("json", false, "print a JSON array")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("secret ls: unexpected arguments %q: %w", pos, errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	items, err := listAllSecrets(ctx, c)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(env.Stdout, items)
	}
	return printSecretTable(env.Stdout, items, time.Now())
}

// listAllSecrets follows the pages of the secret list to its end.
func listAllSecrets(ctx context.Context, c *apiclient.Client) ([]apiv1.Secret, error) {
	return listAll(ctx, "secrets", func(lo apiclient.ListOptions) (apiv1.List[apiv1.Secret], error) {
		return c.ListSecrets(ctx, lo)
	})
}

func printSecretTable(w io.Writer, items []apiv1.Secret, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tCREATED\tUPDATED")
	for _, s := range items {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Name, age(now, s.CreatedAt), age(now, s.UpdatedAt))
	}
	return tw.Flush()
}

const secretRemoveAbout = `Removes secrets of the API key and prints the name of each one removed.
Sandboxes whose credentials name a removed secret keep running; their
gateway no longer has a value to set.

  airlock secret rm openai
  airlock secret ls --json | jq -r '.[].name' | xargs airlock secret rm`

func runSecretRemove(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("secret rm", "airlock secret rm [FLAGS] NAME...", secretRemoveAbout, env)
	sf := addServerFlags(fs)
	names, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return fmt.Errorf("secret rm: give the names of the secrets to remove: %w", errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	return removeEach(env, "secret rm", names, func(x string) error { return c.DeleteSecret(ctx, x) })
}
