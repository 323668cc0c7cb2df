// Command image builds Terrace's OCI image from binaries already built for
// each platform, and pushes it; `make image` and `make push` call it.
//
//	go run ./hack/image build --out bin/image --platform linux/amd64=bin/linux_amd64/terrace,<tofu>,bin/linux_amd64/terrace-runner ...
//	go run ./hack/image push --layout bin/image registry.example.com/terrace:v0.1.0
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/terrace-dev/terrace/internal/image"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: image build|push [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "build":
		err = build(os.Args[2:])
	case "push":
		err = push(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: use build or push", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

// platforms collects --platform os/arch=terrace,tofu[,terrace-runner].
type platforms []image.Platform

func (p *platforms) String() string { return fmt.Sprint(*p) }

func (p *platforms) Set(v string) error {
	plat, bins, ok := strings.Cut(v, "=")
	osName, arch, ok2 := strings.Cut(plat, "/")
	paths := strings.Split(bins, ",")
	if !ok || !ok2 || len(paths) < 2 || len(paths) > 3 || slices.Contains(paths, "") {
		return fmt.Errorf("want os/arch=<terrace binary>,<tofu binary>[,<terrace-runner binary>], got %q", v)
	}
	platform := image.Platform{OS: osName, Architecture: arch, Terrace: paths[0], Tofu: paths[1]}
	if len(paths) == 3 {
		platform.Runner = paths[2]
	}
	*p = append(*p, platform)
	return nil
}

func build(args []string) error {
	fs := flag.NewFlagSet("build", flag.ExitOnError)
	var opts image.Options
	var plats platforms
	out := fs.String("out", "bin/image", "directory of the OCI image layout to write (replaced)")
	created := fs.String("created", "0", "Unix time of every timestamp in the image (make image passes the commit's time)")
	caFile := fs.String("ca-bundle", "", "PEM file to install as the CA bundle (default: the Mozilla roots of golang.org/x/crypto/x509roots/fallback)")
	fs.Var(&plats, "platform", "os/arch=<terrace binary>,<tofu binary>[,<terrace-runner binary>]; repeat for each platform (without terrace-runner, the image links it to terrace)")
	fs.StringVar(&opts.Source, "source", "", "org.opencontainers.image.source label")
	fs.StringVar(&opts.Revision, "revision", "", "org.opencontainers.image.revision label")
	fs.StringVar(&opts.Version, "version", "", "org.opencontainers.image.version label")
	_ = fs.Parse(args)
	secs, err := strconv.ParseInt(*created, 10, 64)
	if err != nil {
		return fmt.Errorf("--created wants Unix seconds: %w", err)
	}
	opts.Created, opts.Platforms = time.Unix(secs, 0), plats
	if *caFile != "" {
		if opts.CABundle, err = os.ReadFile(*caFile); err != nil {
			return err
		}
	}
	idx, err := image.Build(opts)
	if err != nil {
		return err
	}
	digest, err := image.WriteLayout(*out, idx)
	if err != nil {
		return err
	}
	fmt.Printf("%s %s\n", *out, digest)
	return nil
}

func push(args []string) error {
	fs := flag.NewFlagSet("push", flag.ExitOnError)
	dir := fs.String("layout", "bin/image", "OCI image layout written by make image")
	_ = fs.Parse(args)
	if fs.NArg() != 1 {
		return fmt.Errorf("name the image to push: push --layout %s registry/terrace:tag", *dir)
	}
	idx, err := image.ReadLayout(*dir)
	if err != nil {
		return err
	}
	ref, err := image.Push(context.Background(), idx, fs.Arg(0))
	if err != nil {
		return err
	}
	fmt.Println(ref)
	return nil
}
