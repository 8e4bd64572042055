"""Studies: one folder each under the studies dir, holding the space, the Optuna storage and the
Ray Tune experiment(s). Create, resume, extend, list, inspect, and export the best config.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import time
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import yaml

import autofl
from autofl.config import experiment_to_dict, file_problem, read_yaml
from autofl.errors import AutoFLError, ConfigError, StorageError
from autofl.experiment import build_experiment
from autofl.files import check_output_file, write_atomic
from autofl.tuning.store.storage import (
    STORAGE_ENV,
    bind_to_folder,
    check_storage_url,
    close_sqlite,
    in_study_folder,
    is_journal,
    is_sqlite,
    journal_path,
    open_storage,
    probe_storage,
    without_password,
)
from autofl.tuning.strategy.constraints import is_feasible
from autofl.tuning.strategy.objectives import DEFAULT_OBJECTIVE, TEST_METRICS, VALIDATION_OBJECTIVES, best, best_first
from autofl.tuning.strategy.space import SearchSpace, load_space, parse_space, parse_stored_space
from autofl.tuning.strategy.spec import SAMPLER_OPTIONS, SamplerSpec

HOME_ENV = "AUTOFL_HOME"
SPACE_FILE = "space.yaml"
META_FILE = "study.json"
REFERENCE_DIR = "references"  # eval.harmed_clients: the references trials compare with (autofl.harm_references)
TUNE_DIR = "tune"
# the trials as read-only views show them, kept with the stamps of the storage's files they were read
# from (trial_rows): a later view of an idle study reads them without importing Optuna
TRIALS_SNAPSHOT = "trials-snapshot.json"
FINISHED = ("COMPLETE", "PRUNED", "FAIL")
# what study.json held of a study made before 2026-11-28 that now is the ledger's (Ledger.record)
LEGACY_RECORD_KEYS = ("runs", "trials_requested", "root")
# the study's record (Ledger.record): one attribute of the Optuna study, so that one write changes it
# whole (a driver killed mid-write leaves the record before or after, never half of each)
RECORD_ATTR = "autofl_record"
DEFAULT_SAMPLER_KEY = "default_sampler"  # study.json: the default sampler when the space names none
LEGACY_DEFAULT_SAMPLER = {"kind": "tpe", "skip_repeats": False}  # autofl's default until 2026-11-24
DEFAULT_OBJECTIVE_KEY = "default_objective"  # study.json: the objective when the space names none
LEGACY_DEFAULT_OBJECTIVE = "personal_val_acc"  # autofl's default until 2026-12-02 (now its _last3 twin)


def record_of(optuna_study: Any, meta: dict[str, Any]) -> dict[str, Any]:
    """`Ledger.record` of a loaded Optuna study (None: not made yet) whose folder's study.json is
    `meta`: the record kept in the study's attribute, else what a study made before 2026-11-28 kept
    in study.json until its next run."""
    kept = optuna_study.user_attrs.get(RECORD_ATTR) if optuna_study is not None else None
    if kept is None:
        kept = meta
    return {
        "runs": list(kept.get("runs", [])),
        "trials_requested": int(kept.get("trials_requested", 0)),
        "root": kept.get("root"),
    }


def with_created_defaults(tree: Any, meta: dict[str, Any], where: str | Path = META_FILE) -> Any:
    """The space file's mapping with what it leaves unset of the sampler (its kind, skip_repeats) and
    the objective as the autofl that created its study defaulted them (recorded in study.json), so a
    study resumed after an upgrade goes on as it started: its sampler options stay valid for their
    kind, and its trials' values stay comparable (a raw last-round value and a 3-round mean are not). A
    study created before they were recorded had TPE, no skipping, and `personal_val_acc`."""
    created = meta.get(DEFAULT_SAMPLER_KEY, LEGACY_DEFAULT_SAMPLER)
    if not (
        isinstance(created, dict)
        and created.get("kind") in SAMPLER_OPTIONS
        and isinstance(created.get("skip_repeats"), bool)
    ):
        raise StorageError(
            f"{where}: {DEFAULT_SAMPLER_KEY} must be {{kind: one of "
            f"{', '.join(SAMPLER_OPTIONS)}, skip_repeats: true|false}}; got {created!r}"
        )
    objective = meta.get(DEFAULT_OBJECTIVE_KEY, LEGACY_DEFAULT_OBJECTIVE)
    if objective not in VALIDATION_OBJECTIVES:
        raise StorageError(
            f"{where}: {DEFAULT_OBJECTIVE_KEY} must be one of {', '.join(VALIDATION_OBJECTIVES)}; got {objective!r}"
        )
    if not isinstance(tree, dict) or not isinstance(tree.get("sampler", {}), dict):
        return tree  # not a space: the space's own check says so
    named = "objective" in tree or "objectives" in tree
    return {
        **tree,
        "sampler": {"kind": created["kind"], "skip_repeats": created["skip_repeats"], **tree.get("sampler", {})},
        **({} if named else {"objective": objective}),
    }


def created_default_sampler() -> dict[str, Any]:
    """What study.json records of this autofl's sampler defaults (see with_created_defaults)."""
    default = SamplerSpec()
    return {"kind": default.kind, "skip_repeats": default.skip_repeats}


def studies_dir(explicit: str | None = None) -> Path:
    """The studies folder: `explicit` (--dir), else $AUTOFL_HOME, else ./autofl_studies; a path
    that is there but no folder is a ConfigError naming where it came from (a file given as the
    studies folder holds no studies, and saying "no studies" would hide the mistake)."""
    source = "--dir" if explicit else HOME_ENV if os.environ.get(HOME_ENV) else "the default studies folder"
    home = Path(explicit or os.environ.get(HOME_ENV) or "autofl_studies").expanduser().resolve()
    if home.exists() and not home.is_dir():
        raise ConfigError(f"{source} {home}: is not a folder; allowed: a folder that holds studies (or none yet)")
    return home


@dataclass
class StudyFolder:
    """A study's folder: its space, `study.json`, storage and trial rows, what the runner, the
    re-evaluation and the report share. Python callers hold `autofl.Study` (autofl/api.py), which
    wraps one; the two names differ so that one name means one thing."""

    root: Path  # the study's folder
    # the validated space, read once per StudyFolder: the file is the study's own copy and never changes,
    # and validating it builds an experiment per searched bound (storage_url, tune_root and
    # load_optuna all need it)
    _space: SearchSpace | None = field(default=None, init=False, repr=False, compare=False)
    _stored: SearchSpace | None = field(default=None, init=False, repr=False, compare=False)
    # (pid, url, storage): the storage opened once per process and StudyFolder (opening an RDB storage
    # builds Optuna's schema objects and checks its version: about 0.4 s a time on 2 cores)
    _opened: tuple[int, str, Any] | None = field(default=None, init=False, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_opened": None}  # another process opens its own

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def space_file(self) -> Path:
        return self.root / SPACE_FILE

    def space(self) -> SearchSpace:
        """The study's space, fully validated (every searched bound built into an experiment, which
        loads the method, model and dataset registries, and with them torch): before work starts."""
        if self._space is None:
            tree = with_created_defaults(read_yaml(self.space_file), self.meta(), self.root / META_FILE)
            self._space = parse_space(tree, self.space_file)
        return self._space

    def stored_space(self) -> SearchSpace:
        """The study's space as its own copy holds it (validated in full when the study was made),
        read without building experiments: what read-only views (status, studies, the storage's
        place) use, so that they start without torch."""
        if self._space is not None:
            return self._space
        if self._stored is None:
            tree = with_created_defaults(read_yaml(self.space_file), self.meta(), self.root / META_FILE)
            self._stored = parse_stored_space(tree, self.space_file)
        return self._stored

    def meta(self) -> dict[str, Any]:
        """study.json: what is fixed when the study is made (its storage, storage path, default
        sampler, warm start). What changes as it runs is the ledger's (Ledger.record)."""
        path = self.root / META_FILE
        if not path.exists():
            return {}
        try:  # issue 18: a corrupt or unreadable study.json is one line, not a traceback
            meta = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise StorageError(
                f"{path}: cannot be read ({getattr(err, 'strerror', None) or err}); restore it "
                f"from a copy of the study, or remove the study"
            ) from None
        if not isinstance(meta, dict) or not isinstance(meta.get("runs", []), list):
            raise StorageError(f"{path}: not a study record (expected an object, whose 'runs' if any is a list)")
        return meta

    def write_meta(self, meta: dict[str, Any]) -> None:
        write_atomic(self.root / META_FILE, json.dumps(meta, indent=1))

    def storage_url(self) -> str:
        """The study's storage, without password: the space's `storage`, else the `AUTOFL_STORAGE`
        URL recorded when the study was created, else a SQLite file in the study folder (a relative
        journal file lies in the study folder too)."""
        url = self.stored_space().storage or self.meta().get("storage")
        if url is None:
            return sqlite_url(self.root)  # from the folder it is in now: a copied study uses its own file
        check_not_anothers(url, self.root)
        return bind_to_folder(url, self.root)

    def tune_root(self) -> str:
        """Where Tune keeps this study's experiments (trial checkpoints included): `<study>/tune`, or
        `<storage_path>/<study>` when the space or `--storage-path` names a folder every Ray node
        reaches (a shared folder, or a pyarrow URI such as s3://bucket/prefix)."""
        base = self.stored_space().storage_path or self.meta().get("storage_path")
        return f"{base.rstrip('/')}/{self.name}" if base else str(self.root / TUNE_DIR)

    def load_optuna(self):
        """The Optuna study (None before it is made), loaded without Optuna's info lines; the
        verbosity is set back after, so a driver that reads its study before making it (the record
        its on_start shows) still logs what Optuna says then ("A new study created ...")."""
        import optuna

        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            url = self.storage_url()
            if self._opened is not None and self._opened[:2] == (os.getpid(), url):
                storage = self._opened[2]
            else:
                storage = open_storage(url)
                self._opened = (os.getpid(), url, storage)
            return optuna.load_study(study_name=self.optuna_name(storage), storage=storage)
        except KeyError:
            return None
        finally:
            optuna.logging.set_verbosity(verbosity)

    def optuna_name(self, storage: Any = None) -> str:
        """The study's name inside its storage: the folder's name, except in a study folder copied
        under a new name (as docs/guide/search.md advises to take ownership), whose own SQLite file still holds
        the one study under its old name (issue 18), as a journal in the folder does."""
        chosen = self.stored_space().storage or self.meta().get("storage")
        if chosen and not in_study_folder(chosen):
            return self.name
        import optuna

        names = optuna.get_all_study_names(storage or open_storage(self.storage_url()))
        return names[0] if self.name not in names and len(names) == 1 else self.name


STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


STUDY_NAME_RULE = "1-100 letters, digits, '_', '.', '-', starting with a letter or digit (no '/', no '..')"


def is_study_name(name: str) -> bool:
    return bool(STUDY_NAME.fullmatch(name)) and ".." not in name


def check_study_name(name: str, field: str) -> str:
    """A study name is one folder under the studies dir: no path separators, no `..`."""
    if not is_study_name(name):
        raise ConfigError(f"{field}: {name!r} is not a study name; allowed: {STUDY_NAME_RULE}")
    return name


def check_owned(root: Path) -> None:
    """A study folder holds pickles that Tune unpickles on resume: only folders this user owns are resumed."""
    owner = root.stat().st_uid
    if owner != os.geteuid():
        raise StorageError(
            f"study folder {root} belongs to uid {owner}, not to you (uid {os.geteuid()}); Tune "
            f"unpickles files from it on resume, so resume only folders you made or trust: copy it "
            f"(cp -r) to take ownership"
        )


def study_folders(home: Path) -> tuple[list[str], list[str]]:
    """The studies in `home` (folders holding a space.yaml, named as a study may be), and the
    folders that hold one under a name no study may have (`cp -r qs1 "qs1 backup"`, `a..b`):
    those are skipped, never opened, so one of them does not hide the others."""
    if not home.is_dir():
        return [], []
    found = sorted(p.name for p in home.iterdir() if (p / SPACE_FILE).is_file())
    valid = [n for n in found if is_study_name(n)]
    return valid, [n for n in found if not is_study_name(n)]


def existing_studies(home: Path) -> list[str]:
    return study_folders(home)[0]


def open_study(home: Path, name: str) -> StudyFolder:
    root = home / check_study_name(name, "study name")
    if not (root / SPACE_FILE).is_file():
        known = existing_studies(home)
        raise AutoFLError(f"study {name!r} not found in {home}; existing studies: {', '.join(known) or '(none)'}")
    return StudyFolder(root)


def check_not_anothers(url: str, root: Path) -> None:
    """A SQLite file or journal inside another study's folder (a study.json or space copied with its
    absolute URL, `cp -a` of a study created with AUTOFL_STORAGE=sqlite:////...) is that study's:
    writing trials into it would change the other study. One line, exit 2."""
    if is_sqlite(url):
        database = url.split(":///", 1)[-1].split("?", 1)[0]
    elif is_journal(url):
        database = journal_path(url)
    else:
        return
    if not database.startswith("/"):
        return
    own = root.resolve()
    for folder in Path(database).resolve().parents:
        if folder == own:
            return
        if (folder / SPACE_FILE).is_file():
            raise StorageError(
                f"storage: {url} is in study folder {folder}, not in this study's ({own}); a copied "
                f"study must not write into the original: remove 'storage' from {root / META_FILE} "
                f"to use its own store (copy the original's file there first)"
            )


def sqlite_url(root: Path) -> str:
    return f"sqlite:///{root / 'optuna.db'}"


def new_study_storage(space: SearchSpace) -> str | None:
    """The storage a new study will use when it is not the default SQLite file: the space's
    `storage`, else `AUTOFL_STORAGE` (checked; recorded without its password)."""
    if space.storage:
        return space.storage
    env = os.environ.get(STORAGE_ENV)
    if not env:
        return None
    try:
        return without_password(check_storage_url(env, STORAGE_ENV, allow_password=True))
    except ValueError as err:
        raise ConfigError(str(err)) from None


def create_study(
    home: Path,
    space_path: Path | None,
    space: SearchSpace,
    name: str | None,
    storage_path: str | None = None,
    space_text: str | None = None,
) -> StudyFolder:
    """A new study folder, after every check that can fail (name, storage reachable): a failed
    start leaves nothing behind. Its space.yaml is `space_text`, else the file at `space_path`."""
    name = check_study_name(name or space.study, "--name" if name else "study")  # issue 18: the same rules
    root = home / name
    if (root / SPACE_FILE).exists():
        raise AutoFLError(
            f"study {name!r} already exists in {home}; continue it with --resume {name}, "
            f"add trials with --resume {name} --trials N, or pick another --name"
        )

    for own in (SPACE_FILE, META_FILE):  # a link, FIFO or device planted there: refused before anything is written
        check_output_file(root / own)
    storage = new_study_storage(space)
    if storage is not None:
        probe_storage(storage)
    root.mkdir(parents=True, exist_ok=True)
    study = StudyFolder(root)
    recorded = {
        "storage": storage if not space.storage else None,
        "storage_path": storage_path,
        DEFAULT_SAMPLER_KEY: created_default_sampler(),
        DEFAULT_OBJECTIVE_KEY: DEFAULT_OBJECTIVE,
    }
    if any(recorded.values()):
        study.write_meta({**study.meta(), **{k: v for k, v in recorded.items() if v}})
    text = space_text if space_text is not None else space_path.read_text()  # type: ignore[union-attr]
    write_atomic(root / SPACE_FILE, text)  # last: a folder without it is no study (never through a planted link)
    return study


def storage_stamp(url: str) -> list[Any] | None:
    """What changes whenever a file-based storage is written: path, inode, size and modification time
    of an SQLite database and its -wal / -journal files, or of a journal file; None for a server
    (PostgreSQL), whose writes no file shows. An empty file counts as none: a reader's connection
    makes an empty -wal file while it is open."""
    if is_journal(url):
        files = [journal_path(url)]
    elif url.startswith("sqlite:///"):
        db = url[len("sqlite:///") :].split("?", 1)[0]
        files = [db, f"{db}-wal", f"{db}-journal"]
    else:
        return None
    stamp: list[Any] = []
    for name in files:
        try:
            st = os.stat(name)
        except OSError:
            st = None
        if st is None or st.st_size == 0:
            stamp.append([os.path.abspath(name), None])
            continue
        stamp.append([os.path.abspath(name), st.st_ino, st.st_size, st.st_mtime_ns])
    return stamp


SNAPSHOT_FORMAT = 3  # bump when a row's keys change: older snapshots are then read anew (2: "pareto", 3: "record")
SETTLED_S = 2.0  # a storage file modified less than this long ago is read, not taken from the snapshot


def _written_lately(stamp: list[Any]) -> bool:
    """Whether a file of the stamp changed within SETTLED_S: a later write of the same size within a
    filesystem's timestamp granularity (a jiffy on ext4, a second on some network filesystems) would
    leave its stamp as it is, so rows are kept only from a storage that has been still for a while."""
    newest = max((entry[3] for entry in stamp if entry[1] is not None), default=0)
    return time.time_ns() - newest < SETTLED_S * 1e9


def trial_rows(study: StudyFolder, snapshot: bool = False) -> list[dict[str, Any]]:
    """One dict per trial (number, Optuna state, params, last round, objective, values, user_attrs,
    feasible: meets the constraints, pareto: on a multi-objective study's Pareto front).
    With `snapshot` (a caller that knows no driver writes the study now), rows kept in the study
    folder are returned when the storage's files are unchanged since they were read (`storage_stamp`),
    and rows read from Optuna are kept so; a server's storage is always read."""
    return _read_or_kept(study, snapshot)["rows"]


def study_record(study: StudyFolder, snapshot: bool = False) -> dict[str, Any]:
    """The study's record (`Ledger.record`: runs, trials_requested, root): from the rows kept with
    it when `snapshot` allows (see `trial_rows`), else read from the storage without its trials."""
    if snapshot:
        stamp = _settled_stamp(study)
        kept = _kept(study, stamp) if stamp is not None else None
        if kept is not None:
            return dict(kept["record"])
    return read_record(study)


def read_record(study: StudyFolder) -> dict[str, Any]:
    """The study's record read from its storage (through the folder's own handle), not its trials."""
    return record_of(study.load_optuna(), study.meta())


def recorded_width(study: StudyFolder) -> int | None:
    """The population width `resources.population: auto` chose at the study's first run (None: it never
    measured one): a resumed or extended study keeps its cohorts' width."""
    widths = [r["population"] for r in read_record(study)["runs"] if r.get("population") is not None]
    return int(widths[0]) if widths else None


def _settled_stamp(study: StudyFolder) -> list[Any] | None:
    """The storage's stamp, or None for a server's storage or one written within SETTLED_S."""
    stamp = storage_stamp(study.storage_url())
    return None if stamp is None or _written_lately(stamp) else stamp  # a write that recent may not show


def _kept(study: StudyFolder, stamp: list[Any]) -> dict[str, Any] | None:
    """The rows and record kept in the study folder if they were read at `stamp`, else None."""
    try:
        saved = json.loads((study.root / TRIALS_SNAPSHOT).read_text())
        if saved["stamp"] == stamp and saved.get("format") == SNAPSHOT_FORMAT:
            return {"rows": list(saved["rows"]), "record": dict(saved["record"])}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _read_or_kept(study: StudyFolder, snapshot: bool) -> dict[str, Any]:
    """{"rows": trial_rows' rows, "record": the ledger's record}: kept or read (see trial_rows)."""
    stamp = _settled_stamp(study) if snapshot else None
    kept = _kept(study, stamp) if stamp is not None else None
    if kept is not None:
        return kept
    read = _read_storage(study)
    if stamp is not None and storage_stamp(study.storage_url()) == stamp:  # nothing wrote while it was read
        _keep_rows(study, stamp, read)
    return read


def _keep_rows(study: StudyFolder, stamp: list[Any], read: dict[str, Any]) -> None:
    with contextlib.suppress(AutoFLError, OSError, TypeError, ValueError):  # read-only folder: read each time
        write_atomic(study.root / TRIALS_SNAPSHOT, json.dumps({"format": SNAPSHOT_FORMAT, "stamp": stamp, **read}))


def keep_trial_rows(study: StudyFolder) -> None:
    """Leave the study's rows for the read-only commands, as a search's driver does when it ends
    (it holds the study's driver lock, so no one else writes it): the first `autofl status` or
    `studies` after the search then needs no Optuna. The driver's SQLite connections are closed
    first (their last close writes the database file); the rows are kept only if nothing wrote
    while they were read. No SETTLED_S wait: no write can follow unseen, since the next writer is
    a later driver; a reader still takes the rows only once the files have been still that long."""
    close_sqlite()
    stamp = storage_stamp(study.storage_url())
    if stamp is None:  # a server's storage: always read
        return
    read = _read_storage(study)
    close_sqlite()
    if storage_stamp(study.storage_url()) == stamp:
        _keep_rows(study, stamp, read)


def best_row_value(rows: list[dict[str, Any]], mode: str) -> float | None:
    """The value `best_trial` would give, from `trial_rows`' rows (no Optuna import), or None."""
    chosen = best_of_rows(rows, mode)
    return chosen["values"][0] if chosen is not None else None


def best_of_rows(rows: list[dict[str, Any]], mode: str) -> dict[str, Any] | None:
    """The COMPLETE row (of `trial_rows`) with the best (first) objective that meets the study's
    constraints (an infeasible trial is never the best; the first of equals), or None."""
    complete = [r for r in rows if r["state"] == "COMPLETE" and r["values"] and r.get("feasible", True)]
    return best(complete, key=lambda r: r["values"][0], mode=mode)


def pareto_rows(rows: list[dict[str, Any]], mode: str) -> list[dict[str, Any]]:
    """A multi-objective study's Pareto front (Optuna's `best_trials`, as read into the rows' "pareto"),
    best first objective first: `pareto_trials` on rows, no Optuna import."""
    return best_first([r for r in rows if r.get("pareto")], key=lambda r: r["values"][0], mode=mode)


def _read_trial_rows(study: StudyFolder) -> list[dict[str, Any]]:
    ot = study.load_optuna()
    return rows_of(ot) if ot is not None else []


def _read_storage(study: StudyFolder) -> dict[str, Any]:
    """The study's trial rows and record (`Ledger.record`), read from its storage."""
    ot = study.load_optuna()
    return {"rows": rows_of(ot) if ot is not None else [], "record": record_of(ot, study.meta())}


def rows_of(ot: Any) -> list[dict[str, Any]]:
    """`trial_rows`' rows of an Optuna study already loaded (read from its storage, no snapshot)."""
    front = {t.number for t in ot.best_trials} if len(ot.directions) > 1 else set()
    rows = []
    for t in ot.get_trials(deepcopy=False):
        steps = sorted(t.intermediate_values)
        rows.append(
            {
                "number": t.number,
                "state": t.state.name,
                "params": dict(t.params),
                "round": steps[-1] if steps else t.user_attrs.get("round"),  # multi-objective: no per-round values
                "values": list(t.values) if t.values else None,
                # the (first) objective: the final value, else the last round's
                "objective": t.values[0] if t.values else (t.intermediate_values[steps[-1]] if steps else None),
                "tune_trial_id": t.user_attrs.get("tune_trial_id"),
                "user_attrs": dict(t.user_attrs),
                "feasible": is_feasible(t),  # meets the study's constraints (one without any does)
                "pareto": t.number in front,  # on a multi-objective study's Pareto front
            }
        )
    return rows


def with_optuna_states(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows as `api.Study.trials()` gives them (state as `autofl status` shows it, Optuna's in
    "optuna_state") with Optuna's state back in "state", as this module's row functions read it."""
    return [{**r, "state": r["optuna_state"]} for r in rows]


def state_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Trials per Optuna state name (COMPLETE, PRUNED, FAIL, RUNNING, ...)."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    return counts


def first_value(trial: Any) -> float | None:
    """A trial's value, or its first objective's in a multi-objective study (None if it has none)."""
    return trial.values[0] if trial.values else None


def pareto_trials(study: StudyFolder) -> list:
    """A multi-objective study's Pareto front (Optuna's best_trials), best first objective first."""
    ot = study.load_optuna()
    front = list(ot.best_trials) if ot is not None else []
    space = study.stored_space()

    return best_first(front, key=lambda t: t.values[0], mode=space.mode)


def best_trial(study: StudyFolder):
    """Optuna's FrozenTrial of `best_row`'s choice (the same trial, the same one-line errors)."""
    ot = study.load_optuna()
    if ot is None:
        raise AutoFLError(f"study {study.name!r} has no trials yet")
    trials = ot.get_trials(deepcopy=False)
    number = best_row(study, rows_of(ot))["number"]
    return next(t for t in trials if t.number == number)


def no_feasible_row(study: StudyFolder, rows: list[dict[str, Any]]) -> None:
    """Raise, in one line, when the study has COMPLETE trials (`trial_rows`' rows) but none meets its
    constraints."""
    complete = [r for r in rows if r["state"] == "COMPLETE" and r["values"]]
    if complete and not any(r["feasible"] for r in complete):
        raise _none_feasible(study, len(complete))


def _none_feasible(study: StudyFolder, complete: int) -> AutoFLError:
    constraints = study.stored_space().constraints
    return AutoFLError(
        f"study {study.name!r}: none of its {complete} completed trials meets the constraints "
        f"({'; '.join(constraints)}), so there is no best config to export; see autofl status {study.name}"
    )


def best_row(study: StudyFolder, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """`best_trial` on `trial_rows`' rows (no Optuna import): the COMPLETE row with the best (first)
    objective that meets the constraints (the first of equals, as `best_trial`), else the same one-line
    AutoFLError."""
    chosen = best_of_rows(rows, study.stored_space().mode)
    if chosen is not None:
        return chosen
    no_feasible_row(study, rows)
    raise AutoFLError(f"study {study.name!r} has no completed trial yet; see autofl status {study.name}")


CONFIG_ATTR = "config"  # a trial's user attr: its runnable config, resolved when it was asked for


def export_best_config(
    study: StudyFolder, rows: list[dict[str, Any]], reeval: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A complete experiment config of the best trial of `rows` (`trial_rows`'), runnable by `autofl
    train --config`. With a re-evaluation summary, the best candidate by mean objective over its seeds
    (possibly the paper default), and the summary's table and verdict go into the metadata."""
    space = study.stored_space()
    row = next((r for r in reeval["rows"] if r["candidate"] == reeval["best"]), None) if reeval else None
    if row is not None:
        by_number = {r["number"]: r for r in rows}
        attrs = dict(by_number[row["trial"]]["user_attrs"]) if row["trial"] in by_number else {}
        if isinstance(row.get("config"), dict):  # the paper default's config, resolved by the re-evaluation
            attrs = {**attrs, CONFIG_ATTR: row["config"]}
        config = trial_config(study, row["params"], row["trial"], row["search_value"], attrs)
    else:
        best = best_row(study, rows)
        config = trial_config(study, dict(best["params"]), best["number"], best["values"][0], best["user_attrs"])
    if reeval is not None:
        config["metadata"]["reeval"] = {
            "picked": f"{reeval['best']}: best mean {space.objective} over seeds {reeval['seeds']}",
            "verdict": reeval["verdict"],
            "vary_partition": reeval["vary_partition"],
            "table": [{k: v for k, v in r.items() if k != "config"} for r in reeval["rows"]],
        }
    return config


def export_pareto(study: StudyFolder) -> dict[str, Any]:
    """A multi-objective study's Pareto front: per trial its objective values and its runnable config."""
    space = study.stored_space()
    if not space.multi_objective:
        raise ConfigError(
            f"--pareto: study {study.name!r} has one objective ({space.objective}); a Pareto front "
            f"needs `objectives:` in the space"
        )
    front = pareto_trials(study)
    if not front:
        no_feasible_row(study, _read_trial_rows(study))
        raise AutoFLError(f"study {study.name!r} has no completed trial yet; see autofl status {study.name}")
    return {
        "study": study.name,
        "objectives": dict(zip(space.metrics, space.modes or [])),
        "pareto_front": [
            {
                "trial": t.number,
                "values": dict(zip(space.metrics, t.values)),
                "config": trial_config(study, dict(t.params), t.number, t.values[0], t.user_attrs),
            }
            for t in front
        ],
    }


def resolved_config(space: SearchSpace, params: dict[str, Any]) -> dict[str, Any]:
    """The runnable config of one set of searched values: the base with the values set, every
    default filled in by the method (this loads the registries, and with them torch), and the
    trial's own runtime, so that a re-run reproduces its round-by-round metrics exactly."""
    config = experiment_to_dict(build_experiment(space.config(params)))
    config["runtime"]["threads"] = max(1, int(space.resources.cpu))
    if space.resources.gpu == 0:  # resolved `auto` included; an unresolved `auto` keeps the base's device
        config["runtime"]["device"] = "cpu"
    return config


def trial_config(
    study: StudyFolder, params: dict[str, Any], number: int | None, value: float | None, attrs: dict[str, Any]
) -> dict[str, Any]:
    """The runnable config of one set of searched values, with where it came from as metadata. A
    trial's config stored when it was asked for (`CONFIG_ATTR`) is used as it is, so exporting needs
    neither torch nor the registries; a study made before configs were stored resolves it now."""
    stored = attrs.get(CONFIG_ATTR)
    if isinstance(stored, dict):
        space, config = study.stored_space(), copy.deepcopy(stored)
    else:
        space = study.space()
        config = resolved_config(space, params)
    config["metadata"] = {
        "study": study.name,
        "trial": number,
        "tune_trial_id": attrs.get("tune_trial_id"),
        "objective": space.objective,
        "objective_value": value,
        "objective_round": attrs.get("round"),
        "seed": config["seed"],
        "versions": {
            "autofl": autofl.__version__,
            **{name: _installed_version(name) for name in ("torch", "ray", "optuna")},
        },
    }
    tested = {k: attrs[k] for k in TEST_METRICS if k in attrs}
    if tested:  # a trial of a study made before its search sealed the test split
        config["metadata"]["test_metrics_reported_not_optimized"] = tested
    else:
        config["metadata"]["test_split"] = (
            "not read by the search; read only by re-evaluation over fresh seeds "
            "(autofl reeval, best-config export's --reeval)"
        )
    return config


def _installed_version(name: str) -> str:
    """A package's installed version from its metadata (importing torch or Ray to ask took seconds)."""
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def dump_config(config: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(config, indent=2) + "\n"
    return yaml.safe_dump(config, sort_keys=False)


def ensure_space_file(path: str) -> tuple[Path, SearchSpace]:
    space_path = Path(path)
    if not space_path.is_file():
        raise ConfigError(f"--space {path}: {file_problem(space_path).replace(' config', '')}")
    return space_path, load_space(space_path)
