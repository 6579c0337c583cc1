"""Starts the fakesnow Snowflake emulator for the local stack (scripts/stack).

EMULATOR ADAPTATION (test stack only; the Snowflake sink never sees this
file). fakesnow 0.12.1's server answers SELECT and DDL results as Arrow
only (`queryResultFormat: arrow`), while Snowflake answers a session that
asks for JSON (the sink sets `JDBC_QUERY_RESULT_FORMAT=JSON` at login)
with `rowset`: rows of text cells. This launcher makes fakesnow do the
same: each result table is encoded as Snowflake's JSON rowset (every cell
text, NULL as null; see `_cell`), so that the sink's one JSON reader serves
both. Everything else is fakesnow's own server:
`python fakesnow-launch.py --host 127.0.0.1 --port 9070`.

Third adaptation: a session whose client dies in the middle of a
transaction (the tests kill -9 sink runners) leaves it open, and DuckDB then
refuses every later update of the rows it touched. Snowflake aborts such a
detached transaction once it blocks another one and has been idle for five
minutes; here a session idle for DETACHED_AFTER_S seconds is rolled back
(the sink never idles inside a transaction: its statements follow each
other). A live client can still look idle that long when this process is
busy (the fault suite's reads of every row hold its one Python thread):
then its next request must fail, as a statement of a session whose
transaction Snowflake aborted does, not run in autocommit, where the rest
of the transaction would be committed alone (and COMMIT, which fakesnow
answers with success outside a transaction, would hide it). So a session
whose open transaction was rolled back here is ended: its next request
gets Snowflake's "session expired" (390112), and the client logs in again
and retries its whole transaction.

Second adaptation: fakesnow lets DuckDB's constraint and invalid-input
errors escape as HTTP 500 ("Unhandled exception"), where Snowflake answers
a statement error: NULL into a NOT NULL column is Snowflake's 100072
(22000), malformed JSON its 100069 (22P02). They are mapped to those, so
that the sink classifies them as Snowflake's own (a refused row), not as a
server fault to retry.

Fourth adaptation: fakesnow runs `COPY INTO` of a CSV file as DuckDB's
`read_csv`, which guesses each column's type from the values (`007` becomes
the number 7 before it reaches a VARCHAR column) and reads a quoted empty
field (`""`) as NULL. Snowflake loads a CSV field into a VARCHAR column as
the text it is, and with `FIELD_OPTIONALLY_ENCLOSED_BY` an enclosed empty
field as the empty string (only `,,` is NULL under `EMPTY_FIELD_AS_NULL`).
`read_csv` is asked for exactly that (`all_varchar`, `allow_quoted_nulls =
false`); DuckDB casts the text to a typed column on insert, as Snowflake
does. The sink's staging through PUT + COPY INTO (large batches) relies on it.

Fifth adaptation: fakesnow runs an array-bound INSERT (the sink's staging of
up to `stage_threshold_rows` rows) once per row, parsing and rewriting it
each time; the rewrite is done once per request instead
(`_execute_bound_row`). Statements slower than SLOW_STATEMENT_S are logged.
"""

import argparse
import base64
import datetime
import decimal
import json
import os
import sys
import threading
import time

import importlib

import uvicorn

# `fakesnow.server` is also a function of the package: take the module.
server = importlib.import_module("fakesnow.server")

import duckdb
from sqlglot import exp
import snowflake.connector.errors
from fakesnow import copy_into
from fakesnow.cursor import FakeSnowflakeCursor

_execute = FakeSnowflakeCursor.execute


# A statement slower than this is logged with its time (a test that times
# out then shows which statement the emulator spent it on).
SLOW_STATEMENT_S = 2.0


def _execute_bound_row(self, command, kwargs):
    """Fifth adaptation: an INSERT with array bindings, one row at a time.

    fakesnow runs an array-bound statement once per row, each time parsed
    and rewritten by sqlglot (about 6 ms a row here), where Snowflake runs
    it as one statement: 8,000 staged rows took a minute, past the sink's
    request timeout. The first row runs the whole way; the DuckDB SQL it
    produced is kept by the cursor (one per request, so the answer is
    described from that first row), and the next rows with the same text
    run it directly. A row DuckDB refuses runs the whole
    way again, so its error is the one fakesnow reports. `False`: not such
    a row (the caller runs it the whole way)."""
    params = kwargs.get("binding_params")
    if not kwargs.get("server") or not isinstance(params, tuple) or not command.lstrip()[:6].upper() == "INSERT":
        return False
    remembered = getattr(self, "_tributary_bound_sql", None)
    if remembered is None or remembered[0] != command:
        return False
    sql = remembered[1]
    try:
        self._duck_conn.execute(sql, list(params))
    except duckdb.Error:
        return False
    return True


def _remember_bound_sql(self, command, kwargs):
    """Keeps the DuckDB SQL of an INSERT that ran with one row of bindings."""
    transformed = getattr(self, "_last_transformed", None)
    if (
        kwargs.get("server")
        and isinstance(kwargs.get("binding_params"), tuple)
        and command.lstrip()[:6].upper() == "INSERT"
        and isinstance(transformed, exp.Insert)
        and not transformed.args.get("create_stage_name")
        and not transformed.args.get("create_file_format_name")
    ):
        self._tributary_bound_sql = (command, transformed.sql(dialect="duckdb"))


def _execute_mapping_errors(self, *args, **kwargs):
    started = time.monotonic()
    command = args[0] if args else kwargs.get("command", "")
    if _execute_bound_row(self, command, kwargs):
        return self
    try:
        result = _execute(self, *args, **kwargs)
        _remember_bound_sql(self, command, kwargs)
        return result
    except duckdb.ConstraintException as e:
        msg = f"NULL result in a non-nullable column ({str(e.args[0]).splitlines()[0]})"
        raise snowflake.connector.errors.ProgrammingError(msg=msg, errno=100072, sqlstate="22000") from e
    except duckdb.InvalidInputException as e:
        msg = str(e.args[0]).splitlines()[0]
        raise snowflake.connector.errors.ProgrammingError(msg=msg, errno=100069, sqlstate="22P02") from e
    finally:
        took = time.monotonic() - started
        if took > SLOW_STATEMENT_S:
            sql = str(args[0]) if args else str(kwargs.get("command", ""))
            print(f"SLOW {took:.1f}s ({len(sql)} chars): {sql[:300]}", file=sys.stderr, flush=True)


FakeSnowflakeCursor.execute = _execute_mapping_errors

_read_csv = copy_into.ReadCSV.read_expression


def _read_csv_as_text(self, url):
    """`read_csv` as Snowflake reads CSV into text columns (fourth adaptation)."""
    call = _read_csv(self, url)
    call.append("expressions", self.make_eq("all_varchar", True))
    call.append("expressions", self.make_eq("allow_quoted_nulls", False))
    return call


copy_into.ReadCSV.read_expression = _read_csv_as_text

# Marks a payload of this launcher inside `rowsetBase64`.
_MARK = b"tributary-json:"


def _cell(value):
    """A value as Snowflake's JSON result format writes it: text."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    return str(value)


def _to_json_rows(table, _rowtype=None):
    columns = [c.to_pylist() for c in table.columns]
    rows = [[_cell(v) for v in row] for row in zip(*columns)] if columns else []
    return _MARK + json.dumps(rows).encode()


_original = server.query_request

# Idle time after which a session's open transaction counts as detached.
DETACHED_AFTER_S = 3.0
# Per session: a lock held while one of its requests runs, and when its
# last answer left.
_locks: dict = {}
_last: dict = {}
# Sessions whose open transaction the reaper rolled back.
_reaped: set = set()


def _session_token(request):
    return (request.headers.get("Authorization") or "")[17:-1]


def _reap_detached():
    while True:
        time.sleep(1.0)
        now = time.monotonic()
        for token, last in list(_last.items()):
            lock = _locks.get(token)
            if now - last < DETACHED_AFTER_S or lock is None or not lock.acquire(blocking=False):
                continue
            try:
                conn = server.sessions.get(token)
                if conn is not None:
                    try:
                        conn._duck_conn.execute("ROLLBACK")
                    except Exception:  # noqa: BLE001 - no transaction open: nothing to do
                        pass
                    else:
                        _reaped.add(token)
                        print(
                            f"fakesnow-launch: rolled back the open transaction of a session idle {now - last:.1f}s; "
                            "its next request is told the session expired",
                            file=sys.stderr,
                            flush=True,
                        )
                _last.pop(token, None)
            finally:
                lock.release()


async def _query_request(request):
    token = _session_token(request)
    lock = _locks.setdefault(token, threading.Lock())
    await server.run_in_threadpool(lock.acquire)
    try:
        if token in _reaped:
            _reaped.discard(token)
            server.sessions.pop(token, None)
            return server.JSONResponse(
                {
                    "data": {"errorCode": "390112", "sqlState": None},
                    "code": "390112",
                    "message": "Your session has expired. Please login again. (fakesnow-launch: its open "
                    f"transaction was rolled back after {DETACHED_AFTER_S}s idle)",
                    "success": False,
                }
            )
        response = await _original(request)
    finally:
        _last[token] = time.monotonic()
        lock.release()
    body = json.loads(response.body)
    data = body.get("data") or {}
    if data.get("queryResultFormat") == "arrow":
        payload = base64.b64decode(data.pop("rowsetBase64", "") or "")
        data["rowset"] = json.loads(payload[len(_MARK):]) if payload.startswith(_MARK) else []
        data["queryResultFormat"] = "json"
        data["returned"] = len(data["rowset"])
        return server.JSONResponse(body, status_code=response.status_code)
    return response


# The server module imported these names; replacing them there is enough.
server.to_sf = lambda table, rowtype: table
server.to_ipc = _to_json_rows
server.app = server.Starlette(
    routes=[
        server.Route(r.path, _query_request, methods=["POST"]) if r.path == "/queries/v1/query-request" else r
        for r in server.routes
    ]
)

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    # The stack's directory of this service (scripts/stack finds its
    # process by it); fakesnow keeps its databases in memory.
    parser.add_argument("--home", default=".")
    args = parser.parse_args()
    os.chdir(args.home)
    threading.Thread(target=_reap_detached, name="detached transactions", daemon=True).start()
    # What fakesnow.server() runs, in the foreground (uvicorn handles SIGTERM).
    uvicorn.run(server.app, host=args.host, port=args.port, log_level="warning")
