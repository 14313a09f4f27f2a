"""The demo database's three parts: the generator (``webapp.demomesh``), the writer
(``webapp.demowriter``) and the lifecycle (``webapp.demodb``; its tests are in
``tests/test_webapp.py`` with the ``demo-db`` command's).

What is checked here:

* the same arguments write the same file, byte for byte (and the same table dump); another
  seed writes another one;
* the writer stores exactly what the generator makes on its own, with no writer around: so
  the writer draws nothing from the generator's streams, and the order of its inserts
  cannot change the content;
* each part of the mesh draws from a stream of its own: a draw added to one part changes that
  part and nothing that does not depend on it.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

import webapp.demomesh
from tests.support.reach_app import dump, query
from webapp.demodb import write_demo_db
from webapp.demomesh import DemoMesh

pytestmark = pytest.mark.timeout(120)

#: Small enough to write in about a second, big enough for every kind of row (and for
#: relays that share a 2-byte prefix).
SIZES: dict[str, Any] = {"nodes": 300, "observations": 3_000, "seed": 3, "now": 1_780_000_000}


def made(**changes: Any) -> dict[str, list[tuple[Any, ...]]]:
    """The rows of each table as the generator alone makes them (``SIZES`` with ``changes``),
    in the shapes the queries of :func:`stored` read them."""
    sizes = {**SIZES, **changes}
    mesh = DemoMesh(nodes=sizes["nodes"], seed=sizes["seed"], now=sizes["now"])
    traffic = mesh.traffic(sizes["observations"])
    transmissions: list[tuple[Any, ...]] = []
    observations: list[tuple[Any, ...]] = []
    for tx, rows in traffic:
        transmissions.append(tx)
        observations.extend(rows)
    return {
        "nodes": [(n.pubkey, n.name, n.role, n.lat, n.lon, n.last_seen, n.first_seen, adverts)
                  for n, adverts in zip(mesh.nodes, traffic.adverts, strict=True)],
        "observers": [(k, o.pubkey.upper(), o.name, o.last_seen, o.first_seen)
                      for k, o in enumerate(mesh.observers, start=1)],
        "transmissions": transmissions,
        "observations": observations,
        "neighbor_edges": sorted((a, b, c) for (a, b), c in traffic.edges.items()),
    }


def stored(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """The rows of each table of a written demo database."""
    return {
        "nodes": query(db, "SELECT public_key, name, role, lat, lon, last_seen, first_seen, "
                           "advert_count FROM nodes ORDER BY rowid"),
        "observers": query(db, "SELECT rowid, id, name, last_seen, first_seen FROM observers "
                               "ORDER BY rowid"),
        "transmissions": query(db, "SELECT * FROM transmissions ORDER BY id"),
        "observations": query(db, "SELECT * FROM observations ORDER BY id"),
        "neighbor_edges": query(db, "SELECT node_a, node_b, count FROM neighbor_edges "
                                    "ORDER BY node_a, node_b"),
    }


def test_the_same_arguments_write_the_same_file(tmp_path: Path) -> None:
    first, again, other = tmp_path / "a.sqlite", tmp_path / "b.sqlite", tmp_path / "c.sqlite"
    write_demo_db(first, **SIZES)
    write_demo_db(again, **SIZES)
    write_demo_db(other, **{**SIZES, "seed": SIZES["seed"] + 1})
    assert first.read_bytes() == again.read_bytes()
    assert dump(first) == dump(again)
    assert dump(first) != dump(other)


def test_the_writer_stores_exactly_what_the_generator_makes(tmp_path: Path) -> None:
    """Had the writer drawn from a stream of the generator's between two of its steps (as
    it once did, for the nodes' and observers' seen times), the traffic made inside the
    writer would differ from the traffic the generator makes alone."""
    db = tmp_path / "demo.sqlite"
    summary = write_demo_db(db, **SIZES)
    expected = made()
    assert stored(db) == expected
    assert summary.observations == len(expected["observations"]) == SIZES["observations"]
    assert summary.transmissions == len(expected["transmissions"])
    # Every kind of row is there to compare: not a vacuous equality.
    assert all(expected.values())
    assert any(row[7] for row in expected["nodes"])  # ADVERT counts
    assert any(row[7] is None for row in expected["observations"])  # direct receptions


@pytest.mark.parametrize(("part", "changed", "unchanged"), [
    ("seen", {"nodes.seen"},
     {"nodes", "observers", "transmissions", "observations", "neighbor_edges"}),
    ("collisions", {"nodes", "observations", "neighbor_edges"},
     {"nodes.seen", "observers.seen", "nodes.names"}),
    ("routes", {"observations", "neighbor_edges"},
     {"nodes", "nodes.seen", "observers", "observers.seen"}),
    ("traffic", {"transmissions", "observations"},
     {"nodes", "nodes.seen", "observers", "observers.seen"}),
])
def test_a_draw_added_to_one_part_changes_no_other_part(
    monkeypatch: pytest.MonkeyPatch, part: str, changed: set[str], unchanged: set[str]
) -> None:
    """One extra draw at the start of one part's stream (a step added to that part): what
    that part makes changes, and what the other parts make does not."""
    def views(tables: dict[str, list[tuple[Any, ...]]]) -> dict[str, list[tuple[Any, ...]]]:
        return {
            "nodes": [row[:5] for row in tables["nodes"]],  # who and where, not when seen
            "nodes.names": [row[1:3] for row in tables["nodes"]],
            "nodes.seen": [row[5:7] for row in tables["nodes"]],
            "observers": [row[:3] for row in tables["observers"]],
            "observers.seen": [row[3:5] for row in tables["observers"]],
            "transmissions": tables["transmissions"],
            "observations": tables["observations"],
            "neighbor_edges": tables["neighbor_edges"],
        }

    before = views(made())
    real_stream = webapp.demomesh.stream

    def stream_with_a_step_added(seed: int, name: str) -> random.Random:
        rng = real_stream(seed, name)
        if name == part:
            rng.random()
        return rng

    monkeypatch.setattr(webapp.demomesh, "stream", stream_with_a_step_added)
    after = views(made())
    assert {view for view in before if before[view] != after[view]} >= changed
    assert {view for view in unchanged if before[view] != after[view]} == set()
