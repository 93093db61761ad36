"""The run folder, owned here: the name of every file a command writes, each result CSV's columns, the
identity of a row, what state a run is in, and the one way rows are written. Every reader and writer asks
this package, by the names below (``from posbench.runfolder import merge_rows``).

- ``layout``: file names, columns, the keys that identify a row, the state of the weights it measured.
- ``rows``: reading result CSVs and writing them; ``merge_rows`` is the only writer, ``finalize`` ends a run.
- ``records``: the run configs kept beside the rows, the account of why a run stopped, unfinished runs.
- ``lock``: one writing process per folder.
"""

from .layout import (
    ATTENTION_CSV,
    BIAS_CSV,
    BUILDING_PREFIX,
    CHECKPOINT,
    CONTEXT_CSV,
    COPY_CSV,
    ERROR_FILE,
    GENERATION,
    HYDRA_DIR,
    LOCK_FILE,
    MEASUREMENT_COLUMNS,
    MEASUREMENT_KEYS,
    PER_ARTICLE,
    PER_ARTICLE_COLUMNS,
    PER_POSITION,
    PER_POSITION_COLUMNS,
    PROBE_IDENTITY,
    REPORT_DIR,
    REPORT_MARK,
    RESULT_COLUMNS,
    RESULT_FILES,
    RESULT_KEYS,
    RESULTS,
    RESUME_CHECKPOINT,
    RUN_CONFIGS,
    RUN_KEYS,
    SAMPLE_KEYS,
    SAMPLES,
    STATE_COLUMNS,
    TASK_RESULTS,
    TRAIN_LOG,
    ModelState,
    find,
    legacy_run_id,
    model_state,
    new_run_id,
    require,
)
from .lock import busy, check_free, lock_run_dir, remove_orphaned_temp_files
from .records import clear_error, errors_recorded, record_error, run_configs, save_run_config, unfinished_reason
from .rows import (
    check_mergeable,
    earlier_measurement,
    finalize,
    identity_of,
    measured_rows,
    merge_records,
    merge_rows,
    read_csv,
    read_mergeable,
)

# fmt: off
__all__ = [
    # layout
    "RESULTS", "PER_POSITION", "PER_ARTICLE", "TRAIN_LOG", "CONTEXT_CSV", "COPY_CSV", "ATTENTION_CSV", "BIAS_CSV",
    "GENERATION", "SAMPLES", "TASK_RESULTS", "CHECKPOINT", "RESUME_CHECKPOINT", "ERROR_FILE", "LOCK_FILE",
    "HYDRA_DIR", "RUN_CONFIGS", "REPORT_DIR", "BUILDING_PREFIX", "REPORT_MARK",
    "STATE_COLUMNS", "RUN_KEYS", "RESULT_KEYS", "SAMPLE_KEYS", "MEASUREMENT_KEYS", "RESULT_FILES",
    "RESULT_COLUMNS", "MEASUREMENT_COLUMNS", "PER_POSITION_COLUMNS", "PER_ARTICLE_COLUMNS", "PROBE_IDENTITY",
    "ModelState", "new_run_id", "legacy_run_id", "model_state", "find", "require",
    # rows
    "read_csv", "read_mergeable", "check_mergeable", "merge_rows", "identity_of", "merge_records", "finalize",
    "measured_rows", "earlier_measurement",
    # records
    "save_run_config", "run_configs", "record_error", "errors_recorded", "clear_error", "unfinished_reason",
    # lock
    "lock_run_dir", "check_free", "busy", "remove_orphaned_temp_files",
]
# fmt: on
