"""kombu's filesystem transport (the embedded default's broker), each message written whole.

kombu's own creates a message's file in the queue folder, then writes it: a consumer polling
in between takes the empty file, and the worker dies on JSON it cannot read. A worker that
retries a task with a countdown publishes from its timer thread while its main thread polls,
so a waiting evaluation met that every few dozen tries. Here a message is written under a name
no queue reads, then renamed into place, which is atomic within one folder. Consumers take
messages in the order of their names; kombu's millisecond stamps tie within one millisecond
(then the random suffix decides), so a name here starts with a stamp no earlier put shares.
"""

import os
import threading
import uuid
from time import monotonic_ns

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

_stamp_lock = threading.Lock()
_last_stamp = 0


def _next_stamp() -> int:
    """A monotonic nanosecond stamp, strictly above every earlier one in this process."""
    global _last_stamp
    with _stamp_lock:
        _last_stamp = max(monotonic_ns(), _last_stamp + 1)
        return _last_stamp


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        """Put `payload` onto `queue`, named so that consumers read it after every earlier put."""
        name = f"{_next_stamp():020d}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f".partial-{uuid.uuid4()}")  # no queue's
        try:
            with open(partial, "wb") as out:
                out.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
