"""``flask --app webapp demo-db``: write the deterministic demo database.

A plain click command (no app context): it needs no database, so it works before any
database exists. Progress goes to stderr, the one-line summary to stdout.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .demowriter import DEFAULT_NODES, DEFAULT_OBSERVATIONS, DEFAULT_SEED, write_demo_db

__all__ = ["demo_db_command"]


def _default_out() -> Path:
    return Path(__file__).resolve().parent / "data" / "demo.sqlite"


@click.command("demo-db")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write it (replaced if present)  [default: webapp/data/demo.sqlite]")
@click.option("--nodes", type=click.IntRange(min=10), default=DEFAULT_NODES, show_default=True,
              help="Nodes in the mesh.")
@click.option("--observations", type=click.IntRange(min=1), default=DEFAULT_OBSERVATIONS,
              show_default=True, help="Observation rows.")
@click.option("--seed", type=int, default=DEFAULT_SEED, show_default=True,
              help="Same seed, sizes and --now: same content.")
@click.option("--now", "now", type=click.IntRange(min=0), default=None,
              help="Unix time the 30-day window ends at  [default: the start of this hour]")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
def demo_db_command(out: Path | None, nodes: int, observations: int, seed: int,
                    now: int | None, quiet: bool) -> None:
    """Write a deterministic synthetic mesh database in the CoreScope schema."""
    target = out if out is not None else _default_out()
    interactive = sys.stderr.isatty()
    next_report = [0.0]

    def progress(done: int, total: int) -> None:
        if quiet:
            return
        share = done / total
        if interactive:
            click.echo(f"\r  {done:,} / {total:,} observations", nl=done >= total, err=True)
        elif share >= next_report[0] or done >= total:
            click.echo(f"  {done:,} / {total:,} observations", err=True)
            next_report[0] = share + 0.1

    try:
        summary = write_demo_db(target, nodes=nodes, observations=observations, seed=seed,
                                now=now, progress=progress)
    except (OSError, ValueError, RuntimeError) as exc:
        raise click.ClickException(f"cannot write {target}: {exc}") from None
    click.echo(
        f"wrote {summary.path}: {summary.nodes:,} nodes ({summary.repeaters:,} path-capable), "
        f"{summary.observers:,} observers, {summary.transmissions:,} transmissions, "
        f"{summary.observations:,} observations, seed {summary.seed}, now {summary.now}, "
        f"in {summary.seconds:.1f} s"
    )
