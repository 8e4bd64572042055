"""Where Ray's, Tune's and Optuna's own output goes during a study command: into the study folder
(`<study>/logs/driver.log` for the driver's log records and Python warnings, `workers.log` for
what trial processes log, e.g. Tune's checkpoint notices), not the terminal, which shows
autofl's own view. `-v` streams them to the terminal as well (autofl/tuning/tune/ray_start.py)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path

LOG_DIR = "logs"
_LOGGERS = ("ray", "optuna", "py.warnings")
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def route_driver_logs(study_root: Path, verbose: bool) -> Path:
    """Send the driver's log records (Ray, Tune, Optuna, any library) and Python warnings to
    `<study>/logs/driver.log`, and to stderr with `verbose`. The handlers sit on the root logger:
    `ray.init(configure_logging=False)` clears the "ray" logger's own handlers while it starts
    (and logs its token notice then), so Ray's records must reach them by propagation."""
    import optuna
    import ray  # noqa: F401  (importing Ray installs its stderr handler: removed below)

    folder = study_root / LOG_DIR
    if folder.is_symlink():  # issue 18: never log through a link planted in the study folder
        folder.unlink()
    folder.mkdir(exist_ok=True)
    for name in ("driver.log", "workers.log"):
        if (folder / name).is_symlink():
            (folder / name).unlink()
    handlers: list[logging.Handler] = [logging.FileHandler(folder / "driver.log")]
    if verbose:
        handlers.append(logging.StreamHandler(sys.stderr))
    root = logging.getLogger()
    for handler in handlers:
        handler.setFormatter(logging.Formatter(_FORMAT))
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    optuna.logging.disable_default_handler()
    logging.captureWarnings(True)
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
        logger.setLevel(logging.NOTSET)
    return folder


def worker_log_hook(path: str) -> Callable[[], None]:
    """A Ray `worker_process_setup_hook` (public runtime-env API): each worker process appends its
    log records (Ray's, Tune's, Optuna's, any library's) and Python warnings to `path`, the study's
    `logs/workers.log`. A node where the study folder cannot be written keeps Ray's own handling."""

    def autofl_worker_logs() -> None:
        try:
            handler = logging.FileHandler(path, mode="a")
        except OSError:
            return
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [pid %(process)d]: %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        if root.level > logging.INFO or root.level == logging.NOTSET:
            root.setLevel(logging.INFO)
        logging.captureWarnings(True)
        ray_logger = logging.getLogger("ray")  # Ray's records do not propagate to the root logger
        if not ray_logger.propagate:
            ray_logger.addHandler(handler)

    return autofl_worker_logs
