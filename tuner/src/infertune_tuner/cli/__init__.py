"""The tuner's commands: `tune`, `export-replay`, `predict`, `gpus`, `models`, `bench` and
`simserver`, none of which needs a cluster.

`commands.mount` puts them on a program's Typer app (`infertune` mounts them beside its cluster
commands); `support` is what every infertune command line shares (error reporting, help
style, choices); `simserver` also runs as a program of its own
(``python -m infertune_tuner.cli.simserver``).
"""
