// composecheck loads a Compose file with the Compose Specification's own loader (the one `docker compose` uses),
// which validates it against the specification's JSON schema and resolves it, and prints the resolved model.
// The machines this project is developed on have no Docker engine and no compose plugin; this checks the file
// the way `docker compose config` would.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/compose-spec/compose-go/v2/cli"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: composecheck COMPOSE_FILE")
		os.Exit(2)
	}
	path, err := filepath.Abs(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "composecheck:", err)
		os.Exit(2)
	}
	options, err := cli.NewProjectOptions(
		[]string{path},
		cli.WithWorkingDirectory(filepath.Dir(path)),
		cli.WithOsEnv,
		cli.WithInterpolation(true),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "composecheck:", err)
		os.Exit(2)
	}
	project, err := options.LoadProject(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "composecheck: invalid:", err)
		os.Exit(1)
	}
	out, err := project.MarshalJSON()
	if err != nil {
		fmt.Fprintln(os.Stderr, "composecheck:", err)
		os.Exit(1)
	}
	fmt.Println(string(out))
}
