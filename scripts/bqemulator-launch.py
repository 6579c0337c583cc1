"""Starts the bqemulator BigQuery emulator for the local stack (scripts/stack).

bqemulator insists on DuckDB's `spatial` extension at start-up and runs
`INSTALL spatial`, which downloads it from DuckDB's extension repository.
The stack runs without internet access, so this launcher makes the extension
optional: it is loaded when it is already installed, and otherwise the
emulator runs without it (GEOGRAPHY functions then fail; Tributary's tests
do not rely on them). Everything after that is bqemulator's own CLI:
`python bqemulator-launch.py start --rest-port ...`.
"""

import sys

from bqemulator.storage import engine


def _load_spatial_if_present(self):
    try:
        # LOAD only: INSTALL would try the network (and may hang on it).
        self._connection.execute("LOAD spatial")
    except Exception as exc:  # noqa: BLE001 - any failure means "not there"
        print(f"bqemulator-launch: DuckDB spatial extension not available ({exc}); "
              "GEOGRAPHY functions are disabled", file=sys.stderr)


engine.DuckDBEngine._load_spatial = _load_spatial_if_present

if __name__ == "__main__":
    from bqemulator.cli import main

    sys.argv[0] = "bqemulator"
    main()
