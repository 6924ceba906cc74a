package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/lizard-build/lizard/internal/identity"
	"github.com/lizard-build/lizard/internal/seal"
	"github.com/lizard-build/lizard/internal/secrets"
	"github.com/lizard-build/lizard/internal/store"
)

// The secrets key and the workload-identity issuer (docs/OPERATIONS.md,
// "Secrets and workload identity"). The key itself may also come in
// LIZARD_SECRETS_KEY (and the previous one in
// LIZARD_SECRETS_PREVIOUS_KEY), which are the key, not a file: reservedEnv.
const (
	secretsKeyEnv         = "LIZARD_SECRETS_KEY"
	secretsPreviousKeyEnv = "LIZARD_SECRETS_PREVIOUS_KEY"
)

// secretsFlags are the flags of the secrets key and the issuer, shared by
// serve and the secrets and identity commands.
type secretsFlags struct {
	keyFile, previousKeyFile string
	issuer                   string
	tokenLifetime            time.Duration
	keyRotation              time.Duration
}

func (f *secretsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.keyFile, "secrets-key-file", "", "file holding the key that seals secrets and the workload-identity signing keys in the database "+
		"(32 bytes as base64 or hex: lizard secrets gen-key); or the key itself in "+secretsKeyEnv+". Without one, creating and updating secrets is refused and --oidc-issuer cannot be set")
	fs.StringVar(&f.previousKeyFile, "secrets-previous-key-file", "", "during a key rotation: the key that sealed values before --secrets-key-file's (or "+secretsPreviousKeyEnv+"); "+
		"it only opens them, until lizard secrets rotate-key has resealed them all")
	fs.StringVar(&f.issuer, "oidc-issuer", "", "workload identity: the public URL of this OIDC issuer (https://…), where cloud providers fetch "+
		"<URL>/.well-known/openid-configuration and the key set; it routes to --listen. Empty: workload identity is off")
	fs.DurationVar(&f.tokenLifetime, "oidc-token-lifetime", identity.DefaultLifetime, "workload identity: a token's lifetime when its registration names none (1m to 1h)")
	fs.DurationVar(&f.keyRotation, "oidc-key-rotation", identity.DefaultRotation, "workload identity: the age at which a new signing key is made (published an hour before it signs)")
}

// keyring is the secrets keyring the flags and variables give, nil when
// they give no key. A key given both in a file and in a variable is
// refused: one source, so that which key is in force is never a guess.
func (f *secretsFlags) keyring() (*seal.Keyring, error) {
	cur, ok, err := keyFrom("--secrets-key-file", f.keyFile, secretsKeyEnv)
	if err != nil || !ok {
		if err == nil && f.previousKeyFile != "" {
			err = errors.New("--secrets-previous-key-file without --secrets-key-file: give the current key too")
		}
		return nil, err
	}
	prev, ok, err := keyFrom("--secrets-previous-key-file", f.previousKeyFile, secretsPreviousKeyEnv)
	if err != nil {
		return nil, err
	}
	if !ok {
		return seal.NewKeyring(cur), nil
	}
	return seal.NewKeyring(cur, prev), nil
}

// keyFrom reads a key from a file flag or an environment variable.
func keyFrom(flagName, file, env string) (seal.Key, bool, error) {
	text, inEnv := os.LookupEnv(env)
	switch {
	case file != "" && inEnv:
		return seal.Key{}, false, fmt.Errorf("%s and %s are both set: give the key one way", flagName, env)
	case file != "":
		k, err := seal.ReadKeyFile(file)
		if err != nil {
			return seal.Key{}, false, fmt.Errorf("%s: %w", flagName, err)
		}
		return k, true, nil
	case inEnv:
		k, err := seal.ParseKey(text)
		if err != nil {
			return seal.Key{}, false, fmt.Errorf("%s: %w", env, err)
		}
		return k, true, nil
	}
	return seal.Key{}, false, nil
}

// issuerConfig is the issuer's configuration over st.
func (f *secretsFlags) issuerConfig(st store.Store, keys *seal.Keyring, log *slog.Logger) (identity.Config, error) {
	ids, ok := st.(store.Identity)
	if !ok {
		return identity.Config{}, fmt.Errorf("the %T store cannot keep workload-identity keys", st)
	}
	return identity.Config{Store: ids, Keys: keys, Issuer: f.issuer, Lifetime: f.tokenLifetime, Rotation: f.keyRotation, Logger: log}, nil
}

// secretStore is st's part that keeps secrets.
func secretStore(st store.Store) (store.Secrets, error) {
	ss, ok := st.(store.Secrets)
	if !ok {
		return nil, fmt.Errorf("the %T store cannot keep secrets", st)
	}
	return ss, nil
}

// secretsCmd is `lizard secrets gen-key|rotate-key`.
func secretsCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("secrets", flag.ContinueOnError)
	dataDir := fs.String("data-dir", defaultDataDir, "state directory")
	database := fs.String("database", "", databaseUsage)
	var sf secretsFlags
	sf.register(fs)
	pos, err := configure(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) == 1 && pos[0] == "gen-key":
		// A new key on stdout: the operator writes it to a file of mode 600.
		fmt.Println(seal.NewKey().Encode())
		return nil
	case len(pos) == 1 && pos[0] == "rotate-key":
	default:
		return errors.New(usage)
	}
	keys, err := sf.keyring()
	if err != nil {
		return err
	}
	if keys == nil {
		return errors.New("secrets rotate-key: give the new key (--secrets-key-file or " + secretsKeyEnv + ") and the old one (--secrets-previous-key-file or " + secretsPreviousKeyEnv + ")")
	}
	st, err := openStore(ctx, *dataDir, *database)
	if err != nil {
		return err
	}
	defer st.Close()
	ss, err := secretStore(st)
	if err != nil {
		return err
	}
	ids, ok := st.(store.Identity)
	if !ok {
		return fmt.Errorf("the %T store cannot keep workload-identity keys", st)
	}
	svc := secrets.New(ss, keys)
	n, err := svc.Reseal(ctx)
	if err != nil {
		return fmt.Errorf("resealed %d secrets, then: %w", n, err)
	}
	m, err := identity.Reseal(ctx, ids, keys)
	if err != nil {
		return fmt.Errorf("resealed %d secrets and %d signing keys, then: %w", n, m, err)
	}
	counts, err := svc.Sealed(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("resealed %d secrets and %d workload-identity signing keys under key %s\n", n, m, keys.Current())
	for fp, c := range counts {
		if fp != keys.Current() {
			return fmt.Errorf("%d secrets are still sealed with key %s (changed during the rotation?): run rotate-key again", c, fp)
		}
	}
	fmt.Printf("every secret is sealed with key %s: the previous key can go (remove --secrets-previous-key-file and restart the servers)\n", keys.Current())
	return nil
}

// identityCmd is `lizard identity keys|rotate-key`.
func identityCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("identity", flag.ContinueOnError)
	dataDir := fs.String("data-dir", defaultDataDir, "state directory")
	database := fs.String("database", "", databaseUsage)
	activateIn := fs.Duration("activate-in", identity.PublishAhead, "rotate-key: the new key signs from this long on (published at once; 0: signs now, for a key that leaked)")
	dropOld := fs.Bool("drop-old", false, "rotate-key: delete the keys older than the one that signs now (their tokens stop verifying); with --activate-in 0 for a key that leaked")
	var sf secretsFlags
	sf.register(fs)
	pos, err := configure(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || (pos[0] != "keys" && pos[0] != "rotate-key") {
		return errors.New(usage)
	}
	if sf.issuer == "" {
		return errors.New("identity: workload identity is off: give --oidc-issuer (as lizard serve has it)")
	}
	keys, err := sf.keyring()
	if err != nil {
		return err
	}
	st, err := openStore(ctx, *dataDir, *database)
	if err != nil {
		return err
	}
	defer st.Close()
	cfg, err := sf.issuerConfig(st, keys, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	iss, err := identity.New(ctx, cfg)
	if err != nil {
		return err
	}
	if pos[0] == "rotate-key" {
		k, err := iss.Rotate(ctx, *activateIn)
		if err != nil {
			return err
		}
		fmt.Printf("signing key %s (generation %d) made; it signs from %s\n", k.ID, k.Generation, k.ActivateAt.Format(time.RFC3339))
		if *dropOld {
			n, err := iss.DropOld(ctx)
			if err != nil {
				return err
			}
			fmt.Printf("%d older keys deleted\n", n)
		}
	}
	tw := newTabWriter(os.Stdout)
	fmt.Fprintln(tw, "KID\tGENERATION\tCREATED\tSIGNS_FROM")
	for _, k := range iss.Keys() {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", k.ID, k.Generation, k.CreatedAt.Format(time.RFC3339), k.ActivateAt.Format(time.RFC3339))
	}
	return tw.Flush()
}
