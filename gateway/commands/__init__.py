"""Command-line subcommands of the `gateway` console script."""
