"""FairQueue: the scheduler's waiting sequences, served round-robin across requests.

A plain FIFO lets one request of 20,000 prompts hold every queue position: a second
client's two-token request waits behind all of them. Here each request (a `group`: every
prompt and sample of one API call) has its own FIFO, and admission takes the head of one
group after another, so a request waits for at most one admission per other waiting
request, however many sequences those hold. Within a group the order is FIFO; a preempted
sequence goes back to the front of its group, and its group to the front of the rotation.

Removal (abort) is O(1): the sequence is forgotten here and skipped when it reaches a head,
so aborting a 20,000-prompt request costs 20,000 steps, not 20,000 scans.
"""

from __future__ import annotations

from collections import OrderedDict, deque


class FairQueue:
    def __init__(self):
        self._groups: OrderedDict[int, deque] = OrderedDict()  # group -> its sequences, rotation order
        self._queued: set[int] = set()  # seq_ids present (removed ones linger in the deques)

    def __len__(self) -> int:
        return len(self._queued)

    def __bool__(self) -> bool:
        return bool(self._queued)

    def __contains__(self, seq) -> bool:
        return seq.seq_id in self._queued

    def append(self, seq) -> None:
        self._groups.setdefault(seq.group, deque()).append(seq)
        self._queued.add(seq.seq_id)

    def appendleft(self, seq) -> None:
        """Back to the front: a preempted sequence is the next one admitted."""
        self._groups.setdefault(seq.group, deque()).appendleft(seq)
        self._groups.move_to_end(seq.group, last=False)
        self._queued.add(seq.seq_id)

    def remove(self, seq) -> None:
        self._queued.discard(seq.seq_id)

    def group_ids(self) -> set[int]:
        return set(self._groups)

    def peek(self, skip: set[int] = frozenset()):
        """The sequence admission would take next, passing over the groups in `skip`;
        None when there is none."""
        for group in list(self._groups):
            seqs = self._groups[group]
            while seqs and seqs[0].seq_id not in self._queued:
                seqs.popleft()
            if not seqs:
                del self._groups[group]
            elif group not in skip:
                return seqs[0]
        return None

    def popleft(self):
        """Takes the next sequence; its group goes to the back of the rotation."""
        return self.take(self.peek())

    def take(self, seq):
        """Takes `seq`, the head of its group (from peek); its group goes to the back."""
        seqs = self._groups[seq.group]
        seqs.popleft()
        self._queued.discard(seq.seq_id)
        if seqs:
            self._groups.move_to_end(seq.group)
        else:
            del self._groups[seq.group]
        return seq
