"""kombu's filesystem transport (the embedded default's broker), each message written whole.

kombu's own creates a message's file in the queue folder, then writes it: a consumer polling
in between takes the empty file, and the worker dies on JSON it cannot read. A worker that
retries a task with a countdown publishes from its timer thread while its main thread polls,
so a waiting evaluation met that every few dozen tries. Here a message is written under a name
no queue reads, then renamed into place, which is atomic within one folder.
"""

import os
import uuid
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        """Put `payload` onto `queue`: named as kombu names it, so consumers read it in order."""
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
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
