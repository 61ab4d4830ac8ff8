"""AdminService's RPCs for blocked users, served by the front alone (a cluster's policy leaves
them out): the blocks live in the front's store, which every front replica reads on each create.
The guard audits BlockUser and UnblockUser; GetUserBlock and ListBlockedUsers are reads. The
front's AdminService servicer (front/admin.py) holds a BlockAdmin and hands these calls to it."""

from __future__ import annotations

from typing import Callable

from provisioner.api import convert, guard
from provisioner.api.paging import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE
from provisioner.model.errors import InvalidArgument
from provisioner.front.blocks import Block, Pusher
from provisioner.store import Store
from provisioner.v1 import admin_service_pb2 as admin_pb

BLOCK_RPCS = ("BlockUser", "UnblockUser", "GetUserBlock", "ListBlockedUsers")
DECISIONS_SHOWN = 20  # and past blocks


class BlockAdmin:
    def __init__(self, store: Store, clock, pusher: Callable[[], Pusher | None]):
        """`clock`: the fleet's (a block's time); `pusher`: the fleet's block pusher, if it has one."""
        self._store, self.clock, self._pusher = store, clock, pusher

    def _push(self) -> None:
        """The clusters hear of the change (front/blocks.py: they requeue no blocked user's session)."""
        if (pusher := self._pusher()) is not None:
            pusher.soon()

    async def block(self, request: admin_pb.BlockUserRequest) -> admin_pb.BlockUserResponse:
        _need_user(request.user_id)
        if not request.reason:
            raise InvalidArgument("reason must not be empty: say why the user is blocked", field="reason")
        store = self._store
        new = await store.commit(store.blocks.block_user, request.user_id, self.clock.now(),
                                 guard.current().caller.identity, request.reason, "")
        self._push()
        out = admin_pb.BlockUserResponse(already_blocked=not new)
        if (block := Block.read(store, request.user_id)) is not None:  # None only if unblocked meanwhile
            out.block.CopyFrom(block_pb(block))
        return out

    async def unblock(self, request: admin_pb.UnblockUserRequest) -> admin_pb.UnblockUserResponse:
        _need_user(request.user_id)
        store = self._store
        lifted = await store.commit(store.blocks.unblock_user, request.user_id, self.clock.now(),
                                    guard.current().caller.identity)
        self._push()
        out = admin_pb.UnblockUserResponse()
        if lifted is not None:
            out.block.CopyFrom(block_pb(Block(*lifted)))
        return out

    async def get(self, request: admin_pb.GetUserBlockRequest) -> admin_pb.GetUserBlockResponse:
        _need_user(request.user_id)
        out = admin_pb.GetUserBlockResponse(decisions=[
            admin_pb.AbuseDecision(session_id=s, decision_time=convert.timestamp(at), rules=rules.split(","),
                                   reason=reason, evidence=evidence, dry_run=not blocked)
            for s, at, rules, reason, evidence, blocked in self._store.blocks.abuse_decisions(request.user_id,
                                                                                        DECISIONS_SHOWN)],
            past_blocks=[block_pb(Block(*row[:5]), *row[5:]) for row in self._store.blocks.lifted_blocks(request.user_id, DECISIONS_SHOWN)])
        if (block := Block.read(self._store, request.user_id)) is not None:
            out.block.CopyFrom(block_pb(block))
        return out

    async def list_blocked(self, request: admin_pb.ListBlockedUsersRequest) -> admin_pb.ListBlockedUsersResponse:
        if request.page_size < 0:
            raise InvalidArgument("page_size must not be negative", field="page_size")
        size = min(request.page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        start = int(request.page_token or 0)  # digits only (api/limits.py)
        rows = self._store.blocks.blocked_users(size + 1, start)  # one more: is there a next page?
        return admin_pb.ListBlockedUsersResponse(blocks=[block_pb(Block(*r)) for r in rows[:size]],
                                                 next_page_token=str(start + size) if len(rows) > size else "")


def block_pb(b: Block, lifted_at: float = 0.0, lifted_by: str = "") -> admin_pb.UserBlock:
    """A block, and when and by whom it was lifted if it was."""
    return admin_pb.UserBlock(user_id=b.user_id, block_time=convert.timestamp(b.blocked_at), blocked_by=b.blocked_by,
                              reason=b.reason, evidence=b.evidence, lift_time=convert.timestamp(lifted_at),
                              lifted_by=lifted_by)


def _need_user(user_id: str) -> None:
    if not user_id:
        raise InvalidArgument("user_id must not be empty", field="user_id")
