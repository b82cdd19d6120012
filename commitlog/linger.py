# Owns Linger: how long a background follower of the commit watermark (the
# consume-queue dispatcher, the metadata applier) lets commits gather
# before it works through them.  Settable at any time; setting it to 0 ends
# a wait in progress at once, so a node that starts to lead never sits out
# the rest of a follower's pause.
import attrs
import trio


@attrs.define(eq=False)
class Linger:
    seconds: float = 0.0
    _cut: trio.Event = attrs.Factory(trio.Event)

    def set(self, seconds: float) -> None:
        self.seconds = seconds
        if seconds <= 0:
            self._cut.set()  # (wakes a wait in progress)
            self._cut = trio.Event()

    async def wait(self) -> None:
        """Sleep `seconds`, or until set to 0; at once when it is 0."""
        if self.seconds <= 0:
            return
        with trio.move_on_after(self.seconds):
            await self._cut.wait()
