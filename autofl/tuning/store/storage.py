"""Optuna storages: one place that checks, masks and opens their URLs.

Three back-ends are supported: SQLite (the default, a file in the study folder; one driver at a time),
PostgreSQL through psycopg 3 (`postgresql+psycopg://USER@HOST:PORT/DB`; several drivers), and Optuna's
JournalStorage on a file (`journal:///ABSOLUTE/PATH.log`, or `journal://NAME.log`: a file in the study
folder; several drivers), made for a shared filesystem (NFS, Lustre) where SQLite's locks are not
safe: its writes take Optuna's `JournalFileOpenLock` (a lock file created with O_EXCL, which NFSv3+
makes atomic), and so does autofl's count-then-create of trials (`journal_lock`). A
password never sits in a file that autofl writes or copies: a space's `storage:` must not hold one
(libpq reads it from `PGPASSWORD` or `~/.pgpass`), and a URL given in `AUTOFL_STORAGE` may hold one,
but the study records the URL without it and takes it from the environment again at connect time.
Every URL autofl prints goes through `mask_url`.

SQLite runs in WAL mode with `synchronous=NORMAL`: a commit no longer waits for an fsync (measured
here: 80 single-attribute commits took 0.50 s with the default journal), and a killed process still
loses nothing that was committed; only a power cut can lose the last few commits.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from autofl.errors import StorageError
from autofl.text import is_secret_key, mask_url

STORAGE_ENV = "AUTOFL_STORAGE"
PG_CONNECT_TIMEOUT_S = 10
SCHEMA_RACE_TRIES = 6  # attempts to open a new storage that other processes are creating at the same moment
SCHEMA_RACE_PAUSE_S = 0.1  # the pause before the n-th retry is n times this
ALLOWED = "sqlite:///PATH, postgresql+psycopg://USER@HOST:PORT/DB or journal:///PATH.log"
JOURNAL = "journal:"
JOURNAL_SUGGEST_LOCK = ".autofl-suggest"  # <journal>.autofl-suggest.lock: held around count-then-create


def secret_query_keys(url: str) -> list[str]:
    """The query keys of `url` that carry a password."""
    from sqlalchemy.engine import make_url

    return [k for k in make_url(url).query if is_secret_key(k)]


def check_storage_url(url: str, where: str | None, allow_password: bool = False) -> str:
    """The URL, checked: a supported back-end with its driver installed, and no password unless
    `allow_password` (URLs from the environment). Raises ValueError naming `where` (pydantic
    validators pass None: pydantic names the field itself)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    prefix = f"{where}: " if where else ""
    if is_journal(url):
        return check_journal_url(url, prefix)
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ValueError(f"{prefix}{mask_url(url)!r} is not a database URL; allowed: {ALLOWED}") from None
    backend, driver = parsed.get_backend_name(), parsed.get_driver_name()
    if not allow_password and [k for k in parsed.query if is_secret_key(k)]:
        raise ValueError(
            f"{prefix}the URL holds a password (?password=), and this file is copied into the study "
            f"folder; remove it and set PGPASSWORD or a ~/.pgpass line instead"
        )
    if backend == "postgresql":
        if driver != "psycopg":
            raise ValueError(
                f"{prefix}PostgreSQL goes through psycopg 3: write postgresql+psycopg://..., not {backend}+{driver}://"
            )
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise ValueError(f"{prefix}PostgreSQL needs psycopg: pip install 'psycopg[binary]'") from None
        if parsed.password is not None and not allow_password:
            raise ValueError(
                f"{prefix}the URL holds a password, and this file is copied into the study folder; "
                f"remove it and set PGPASSWORD or a ~/.pgpass line instead"
            )
        if not parsed.database:
            raise ValueError(f"{prefix}{mask_url(url)!r} names no database; allowed: {ALLOWED}")
    elif backend == "sqlite":
        database = parsed.database or ""
        if database in ("", ":memory:") or "mode=memory" in str(parsed.query.get("mode", "")) + database:
            raise ValueError(
                f"{prefix}{mask_url(url)!r} is an in-memory database, which the trial processes "
                f"cannot share and which is lost at exit; allowed: sqlite:////ABSOLUTE/PATH.db"
            )
        if not os.path.isabs(database) and not database.startswith("file:"):
            raise ValueError(
                f"{prefix}{mask_url(url)!r} is a relative path (trials run in other folders); "
                f"allowed: sqlite:////ABSOLUTE/PATH.db (four slashes)"
            )
    else:
        raise ValueError(f"{prefix}back-end {backend!r} is not supported; allowed: {ALLOWED}")
    return url


def is_journal(url: str) -> bool:
    return url.startswith(JOURNAL)


def journal_path(url: str) -> str:
    """The file a journal URL names: `journal:///abs/x.log` -> `/abs/x.log`, `journal://x.log` and
    `journal:x.log` -> `x.log` (relative: a file in the study folder)."""
    path = url[len(JOURNAL) :]
    return path[2:] if path.startswith("//") else path


def check_journal_url(url: str, prefix: str = "") -> str:
    """A journal URL names an absolute file, or a bare file name in the study folder; its folder's
    existence is checked when the storage is opened (a new study: before its folder is made)."""
    path = journal_path(url)
    allowed = "journal:///ABSOLUTE/PATH.log (three slashes) or journal://NAME.log (a file in the study folder)"
    if not path or path.endswith("/") or any(c in path for c in "?#\0"):
        raise ValueError(f"{prefix}{url!r} names no journal file; allowed: {allowed}")
    if not os.path.isabs(path) and ("/" in path or path in (".", "..")):
        raise ValueError(f"{prefix}{url!r} is a relative path with folders; allowed: {allowed}")
    return url


def bind_to_folder(url: str, root: str | os.PathLike[str]) -> str:
    """`url` as the study in folder `root` opens it: a relative journal file lies in that folder
    (a study folder copied elsewhere takes its journal with it); any other URL is unchanged."""
    if is_journal(url) and not os.path.isabs(journal_path(url)):
        return f"{JOURNAL}//{os.path.join(os.path.abspath(root), journal_path(url))}"
    return url


def in_study_folder(url: str) -> bool:
    """Whether the storage belongs to one study folder (a relative journal), as its SQLite file does."""
    return is_journal(url) and not os.path.isabs(journal_path(url))


def without_password(url: str) -> str:
    """`url` with neither a user:pw@ password nor a password query parameter (what a study records)."""
    from sqlalchemy.engine import URL, make_url

    if is_journal(url):
        return url
    parsed = make_url(url)  # URL.set(password=None) keeps the password: build the URL again without it
    query = {k: v for k, v in parsed.query.items() if not is_secret_key(k)}
    return URL.create(
        parsed.drivername,
        username=parsed.username,
        host=parsed.host,
        port=parsed.port,
        database=parsed.database,
        query=query,
    ).render_as_string(hide_password=False)


def connect_url(url: str) -> str:
    """The URL to connect with: `url` itself, or the `AUTOFL_STORAGE` URL it was recorded from
    (which may carry the password)."""
    env = os.environ.get(STORAGE_ENV)
    if env and not url.startswith("sqlite") and not is_journal(url) and without_password(env) == url:
        return env
    return url


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def _fast_sqlite(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def open_storage(url: str):
    """An Optuna storage for `url`: an RDBStorage (SQLite or PostgreSQL) or a JournalStorage (a
    journal file); a storage that cannot be opened (a server that refuses, no password in the
    environment, a corrupt file, a journal whose folder is missing) raises StorageError with one
    masked line."""
    try:
        if is_journal(url):
            return _open_journal(url)
        return _open_rdb_once_created(url)
    except Exception as err:  # any driver error becomes one line
        if isinstance(err, StorageError):
            raise
        text = str(err).strip()
        reason = mask_url(" ".join(text.splitlines()[0].split()) if text else type(err).__name__)
        raise StorageError(f"storage: cannot open {mask_url(url)}: {reason[:300]}") from None


def _open_rdb_once_created(url: str):
    """`_open_rdb`, tried again while another process is creating the same new storage: Optuna creates
    its tables and stamps its schema version by check-then-write, so two processes opening a new
    storage at once (a driver and `autofl status`, two PostgreSQL drivers) can both write, and the
    later one fails with "table ... already exists" or a UNIQUE violation on alembic_version. Once
    the other process has written, the check sees its tables and the retry writes nothing."""
    for attempt in range(1, SCHEMA_RACE_TRIES):
        try:
            return _open_rdb(url)
        except Exception as err:  # only the creation race is retried; the rest propagate
            if not _is_schema_creation_race(err):
                raise
            time.sleep(SCHEMA_RACE_PAUSE_S * attempt)
    return _open_rdb(url)


def _is_schema_creation_race(err: Exception) -> bool:
    """Whether `err` is another process having created a table or stamped the schema version first
    (SQLite: OperationalError "already exists", IntegrityError; PostgreSQL: ProgrammingError
    "already exists", IntegrityError on pg_type's unique index)."""
    from sqlalchemy import exc

    if isinstance(err, exc.IntegrityError):
        return True
    return isinstance(err, (exc.OperationalError, exc.ProgrammingError)) and "already exists" in str(err)


def _open_rdb(url: str):
    import optuna
    import sqlalchemy

    if not is_sqlite(url):
        # a server that does not answer is one line within seconds, not a wait for TCP's timeout
        # (a connect_timeout in the URL's query wins)
        return optuna.storages.RDBStorage(
            connect_url(url),
            engine_kwargs={"pool_pre_ping": True, "connect_args": {"connect_timeout": PG_CONNECT_TIMEOUT_S}},
        )
    engine_kwargs = {"connect_args": {"timeout": 30}}
    storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
    sqlalchemy.event.listen(storage.engine, "connect", _fast_sqlite)
    storage.engine.dispose()  # connections opened while building the schema reconnect with the pragmas
    _SQLITE_ENGINES.add(storage.engine)
    return storage


# the engines of the SQLite storages this process opened (an engine can outlive its storage object,
# its pooled connection open): close_sqlite() ends their connections
_SQLITE_ENGINES: weakref.WeakSet[Any] = weakref.WeakSet()


def close_sqlite() -> None:
    """Close the pooled connections of every SQLite storage this process opened (each reconnects
    when used again). The last connection's close folds SQLite's write-ahead log into the database
    file, so the files' stamps (`study.storage_stamp`) then stay as they are until the next write."""
    for engine in list(_SQLITE_ENGINES):
        engine.dispose()


# journal file -> ((pid, inode), its JournalStorage): one handle per file and process
_JOURNALS: dict[str, tuple[tuple[int, int | None], Any]] = {}


def _open_journal(url: str):
    """One JournalStorage per journal file and process (each open replays the whole log; one handle
    reads only what was appended since), its writes under a JournalFileOpenLock."""
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    path = journal_path(url)
    if not os.path.isabs(path):
        raise StorageError(
            f"storage: {url}: a journal file relative to no study folder; allowed: journal:///ABSOLUTE/PATH.log"
        )
    cached = _JOURNALS.get(path)
    if cached is not None and cached[0] == (os.getpid(), _inode(path)):  # not a file made anew since
        return cached[1]
    folder = os.path.dirname(path) or "/"
    if not os.path.isdir(folder):
        raise StorageError(
            f"storage: {url}: folder {folder} does not exist; create it (on a filesystem every "
            f"node reaches) or fix the path"
        )
    if os.path.isdir(path):
        raise StorageError(f"storage: {url}: is a folder; name the journal file, e.g. journal://{path}/optuna.log")
    storage = optuna.storages.JournalStorage(JournalFileBackend(path, lock_obj=JournalFileOpenLock(path)))
    _JOURNALS[path] = ((os.getpid(), _inode(path)), storage)
    return storage


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


@contextmanager
def journal_lock(url: str) -> Iterator[None]:
    """Held around a driver's count-then-create of trials on a journal shared by several drivers
    (PostgreSQL's advisory lock does this there): Optuna's NFS-safe lock file, next to the journal."""
    from optuna.storages.journal import JournalFileOpenLock

    lock = JournalFileOpenLock(journal_path(url) + JOURNAL_SUGGEST_LOCK)
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


def is_shared(storage: Any) -> bool:
    """Whether several drivers may share an opened storage (PostgreSQL, a journal)."""
    import optuna

    if isinstance(storage, optuna.storages.JournalStorage):
        return True
    engine = getattr(storage, "engine", None)
    return engine is not None and engine.dialect.name == "postgresql"


def probe_storage(url: str) -> None:
    """Connect once (creating Optuna's tables or the journal file if needed) or raise StorageError
    with one masked line. A journal in the study folder is made with the folder: nothing to probe."""
    if in_study_folder(url):
        return
    storage = open_storage(url)
    if not is_journal(url):
        storage.engine.dispose()
