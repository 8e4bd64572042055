"""Where Ray's, Tune's and Optuna's own output goes during a study command: into the study folder
(`<study>/logs/driver.log` for the driver's log records and Python warnings, `workers.log` for
what trial processes print, e.g. Tune's checkpoint notices), not the terminal, which shows
autofl's own view. `-v` streams them to the terminal as well."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path
from typing import IO, Callable

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
    folder.mkdir(exist_ok=True)
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


def route_worker_output(folder: Path, verbose: bool) -> None:
    """After Ray starts: what its worker processes print (forwarded to this driver by Ray's log
    monitor) is appended to `<folder>/workers.log`; it reaches the terminal only with `verbose`.
    Uses Ray's stdstream dispatcher (a private hook); if it moved, worker output stays on the terminal."""
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher
        from ray._private.worker import print_worker_logs
    except ImportError:  # pragma: no cover - a Ray without the hook
        return
    sink: IO[str] = open(folder / "workers.log", "a", buffering=1)

    def to_file(data: dict) -> None:
        print_worker_logs(data, sink)

    if not verbose:
        global_worker_stdstream_dispatcher.remove_handler("ray_print_logs")
    global_worker_stdstream_dispatcher.remove_handler("autofl_logs")
    global_worker_stdstream_dispatcher.add_handler("autofl_logs", to_file)


def start_ray(study_root: Path, address: str | None, verbose: bool,
              meanwhile: Callable[[], None] | None = None) -> Path:
    """Start (or connect to) Ray with its output routed into `<study>/logs/` (returned); `meanwhile`
    runs in a thread while Ray's processes start."""
    from autofl.search.runner import init_ray

    folder = route_driver_logs(study_root, verbose)
    side = threading.Thread(target=meanwhile, daemon=True) if meanwhile is not None else None
    if side is not None:
        side.start()
    init_ray(address)
    route_worker_output(folder, verbose)
    if side is not None:
        side.join()
    return folder
