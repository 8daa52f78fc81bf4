"""The embedded default's broker (platform_site/filesystem_broker.py): a consumer polling while
a message is being written never takes it half written; written, it is read whole, in order."""

import pytest
from kombu import Connection
from kombu.transport.virtual import Empty

from platform_site import filesystem_broker


@pytest.fixture
def channel(tmp_path):
    folders = {name: tmp_path / name for name in ("queue", "processed", "control")}
    for folder in folders.values():
        folder.mkdir()
    connection = Connection(
        "filesystem://",
        transport="platform_site.filesystem_broker:Transport",
        transport_options={
            "data_folder_in": str(folders["queue"]),
            "data_folder_out": str(folders["queue"]),
            "processed_folder": str(folders["processed"]),
            "control_folder": str(folders["control"]),
        },
    )
    yield connection.default_channel
    connection.release()


def test_a_message_being_written_is_not_there_yet_for_a_consumer(channel, monkeypatch):
    polled = []
    real_dumps = filesystem_broker.dumps

    def dumps_while_polled(payload):
        with pytest.raises(Empty):  # another thread polling now: nothing to take yet
            channel._get("celery")
        polled.append(payload)
        return real_dumps(payload)

    monkeypatch.setattr(filesystem_broker, "dumps", dumps_while_polled)
    channel._put("celery", {"body": "first"})
    monkeypatch.setattr(filesystem_broker, "dumps", real_dumps)
    channel._put("celery", {"body": "second"})
    assert polled == [{"body": "first"}]
    assert channel._get("celery") == {"body": "first"}
    assert channel._get("celery") == {"body": "second"}
    with pytest.raises(Empty):
        channel._get("celery")


def test_messages_put_within_one_clock_tick_are_read_in_order(channel, monkeypatch):
    monkeypatch.setattr(filesystem_broker, "monotonic_ns", lambda: 1_000_000)  # a frozen clock
    bodies = [f"message {index}" for index in range(20)]
    for body in bodies:
        channel._put("celery", {"body": body})
    assert [channel._get("celery")["body"] for _ in bodies] == bodies
