"""Hypothesis example databases named by one string, for sharing counterexamples.

A failure Hypothesis finds is saved in its example database and replayed
first by every later run that reads the same database. Pointing every CI job,
fuzzing worker and developer at one database is therefore how a
counterexample found once gets checked everywhere. The same spelling works
for ``dpsim check --db``, ``dpsim fuzz --db`` and ``pytest --dpsim-db``:

  DIR                      a directory (local disk or shared storage)
  redis://HOST:PORT/N      a Redis server, for a fleet of machines
  github:OWNER/REPO[:NAME] the artifact NAME (default hypothesis-example-db)
                           uploaded by that repository's workflows, read-only,
                           in front of the local directory .hypothesis/examples
  none                     no database at all
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    ExampleDatabase,
    GitHubArtifactDatabase,
    MultiplexedDatabase,
    ReadOnlyDatabase,
)

from dpsim.errors import UsageError

#: Where Hypothesis keeps its own database when nobody says otherwise.
LOCAL_DIRECTORY = Path(".hypothesis") / "examples"
GITHUB_ARTIFACT = "hypothesis-example-db"

SPELLINGS = "DIR, redis://HOST:PORT/N, github:OWNER/REPO[:ARTIFACT] or none"


def open_database(spec: str) -> ExampleDatabase | None:
    """The database ``spec`` names; a UsageError says why one cannot be opened."""
    text = spec.strip()
    if not text:
        raise UsageError(f"empty example database; expected {SPELLINGS}")
    if text == "none":
        return None
    if text.startswith(("redis://", "rediss://", "unix://")):
        return _redis(text)
    if text.startswith("github:"):
        return _github(text.removeprefix("github:"))
    if "://" in text:
        raise UsageError(f"example database {text!r}: expected {SPELLINGS}")
    directory = Path(os.path.expanduser(text))
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"example database {text!r} exists and is not a directory")
    return DirectoryBasedExampleDatabase(directory)


def _redis(url: str) -> ExampleDatabase:
    try:
        from hypothesis.extra.redis import RedisExampleDatabase
        from redis import Redis
    except ImportError:  # pragma: no cover - redis is a dependency
        raise UsageError(
            f"example database {url!r} needs the redis client: "
            "pip install 'hypothesis[redis]'"
        ) from None
    try:
        client = Redis.from_url(url)
    except ValueError as error:
        raise UsageError(f"example database {url!r}: {error}") from None
    return RedisExampleDatabase(client)


def _github(text: str) -> ExampleDatabase:
    repository, _, artifact = text.partition(":")
    owner, _, repo = repository.partition("/")
    if not owner or not repo or "/" in repo:
        raise UsageError(
            f"example database 'github:{text}': expected github:OWNER/REPO[:ARTIFACT]"
        )
    shared = GitHubArtifactDatabase(owner, repo, artifact or GITHUB_ARTIFACT)
    # The artifact is a snapshot someone else uploaded: read it, never write to
    # it, and keep what this run finds locally, where a workflow can upload it.
    return MultiplexedDatabase(
        DirectoryBasedExampleDatabase(LOCAL_DIRECTORY), ReadOnlyDatabase(shared)
    )


def probe(database: ExampleDatabase | None, spec: str) -> None:
    """Fail now, in one line, if the database cannot be read (a Redis server
    that is down), rather than in every worker later."""
    if database is None:
        return
    try:
        list(database.fetch(b"dpsim:probe"))
    except Exception as error:
        raise UsageError(
            f"example database {spec!r}: cannot read it ({error})"
        ) from None
