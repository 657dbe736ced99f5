// Command ferretdb-launcher runs FerretDB v1 (SQLite backend) embedded, on loopback.
//
// FerretDB's own cmd/ferretdb panics when built with `go install` (its version.txt is not in the
// module zip); embedding the public ferretdb package from a module of our own avoids that check.
package main

import (
	"context"
	"flag"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/FerretDB/FerretDB/ferretdb"
)

func main() {
	addr := flag.String("listen-addr", "127.0.0.1:27017", "TCP listen address (loopback only)")
	sqliteURL := flag.String("sqlite-url", "file:./", `SQLite URI: an existing directory ending in "/"`)
	// FerretDB logs every error reply at WARN with the whole message, including the "no such command:
	// endSessions" that PyMongo sends at each client close; the local stack asks for "error" to stay quiet.
	logLevel := flag.String("log-level", "warn", "minimum log level: debug, info, warn or error")
	flag.Parse()

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		log.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	f, err := ferretdb.New(&ferretdb.Config{
		Listener:  ferretdb.ListenerConfig{TCP: *addr},
		Logger:    logger,
		Handler:   "sqlite",
		SQLiteURL: *sqliteURL,
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// MongoDBURI() may deadlock before Run, so the address is printed from the flag.
	log.Printf("ferretdb-launcher listening on %s", *addr)
	if err := f.Run(ctx); err != nil && ctx.Err() == nil {
		log.Fatal(err)
	}
}
