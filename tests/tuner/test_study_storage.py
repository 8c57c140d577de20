"""Workers started together on an empty PostgreSQL race to create Optuna's tables
(tuner/search/study.make_storage): the loser's error is retried, any other is raised."""
import psycopg.errors
import pytest
import sqlalchemy.exc

from tuner.search import study


def _failing(errors):
    """An RDBStorage stand-in that raises `errors` in turn, then returns a storage."""
    calls = []

    def storage(url, **kwargs):
        calls.append(url)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "storage"
    return storage, calls


def _sql(cls, orig):
    return cls("CREATE TABLE studies (...)", {}, orig)


@pytest.mark.parametrize("error", [
    _sql(sqlalchemy.exc.IntegrityError, psycopg.errors.UniqueViolation(
        'duplicate key value violates unique constraint "pg_type_typname_nsp_index"')),
    _sql(sqlalchemy.exc.ProgrammingError, psycopg.errors.DuplicateTable(
        'relation "studies" already exists')),   # the race as CI met it, 2026-12-07
    _sql(sqlalchemy.exc.ProgrammingError, psycopg.errors.DuplicateObject(
        'type "studydirection" already exists')),   # and again, Optuna's enum type
])
def test_a_lost_race_for_the_tables_is_retried(monkeypatch, error):
    storage, calls = _failing([error, error])
    monkeypatch.setattr(study.optuna.storages, "RDBStorage", storage)
    monkeypatch.setattr(study.time, "sleep", lambda s: None)
    assert study.make_storage("postgresql://db/optuna") == "storage"
    assert len(calls) == 3


def test_another_programming_error_is_raised_at_once(monkeypatch):
    error = _sql(sqlalchemy.exc.ProgrammingError, psycopg.errors.UndefinedColumn(
        'column "x" does not exist'))
    storage, calls = _failing([error])
    monkeypatch.setattr(study.optuna.storages, "RDBStorage", storage)
    monkeypatch.setattr(study.time, "sleep", lambda s: None)
    with pytest.raises(sqlalchemy.exc.ProgrammingError):
        study.make_storage("postgresql://db/optuna")
    assert len(calls) == 1


def test_a_race_lost_five_times_is_raised(monkeypatch):
    error = _sql(sqlalchemy.exc.ProgrammingError, psycopg.errors.DuplicateTable("exists"))
    storage, calls = _failing([error] * 5)
    monkeypatch.setattr(study.optuna.storages, "RDBStorage", storage)
    monkeypatch.setattr(study.time, "sleep", lambda s: None)
    with pytest.raises(sqlalchemy.exc.ProgrammingError):
        study.make_storage("postgresql://db/optuna")
    assert len(calls) == 5
