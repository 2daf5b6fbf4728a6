"""A refused login or vhost that may come from a stale copy of the definitions (a cluster node that has not applied
a user, vhost or permission committed through another node yet) waits for the runtime's `recheck` once: the
handshake goes on if the definitions arrived meanwhile, and the refusal is final otherwise (pure, pamqp frames)."""

from __future__ import annotations

from pamqp import commands

from node.amqp.events import ChannelOpened, ConnectionClosed, ConnectionOpened
from node.amqp.spec import PROTOCOL_HEADER

from .pamqp_client import Session, Users, close_of, marshal, parse_frames, start_ok

REFUSED = "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details see the broker logfile."
TUNE_OK = commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0)


class ClusterUsers(Users):
    """The definitions of a cluster node: a refusal may be stale."""

    def refusal_may_be_stale(self) -> bool:
        return True


def _kinds(out: list[tuple[int, object]]) -> list[str]:
    return [type(f).__name__ for _, f in out]


def test_a_login_refused_here_waits_and_goes_on_once_the_user_arrives() -> None:
    users = ClusterUsers()
    session = Session(users=users)
    session.send(PROTOCOL_HEADER)
    assert session.send(start_ok(user="new", password="pw")) == []  # held: no Tune, no Close
    assert session.conn.awaiting_recheck and session.events == []
    users.passwords["new"] = "pw"  # the runtime caught up: the user is here now
    users.vhosts["new"] = {"/"}
    session.conn.recheck(0)
    assert not session.conn.awaiting_recheck
    assert _kinds(parse_output(session)) == ["Tune"]
    session.send_frame(0, TUNE_OK)
    assert _kinds(session.send_frame(0, commands.Connection.Open(virtual_host="/"))) == ["OpenOk"]
    assert isinstance(session.events[-1], ConnectionOpened)


def test_a_login_still_refused_after_the_recheck_is_refused() -> None:
    session = Session(users=ClusterUsers())
    session.send(PROTOCOL_HEADER)
    assert session.send(start_ok(password="wrong")) == []
    session.conn.recheck(0)
    assert close_of(parse_output(session)) == (0, 403, REFUSED, 0, 0)
    assert session.events == [ConnectionClosed(403, REFUSED)]


def test_a_vhost_refused_here_waits_and_the_frames_after_it_are_handled_in_order() -> None:
    users = ClusterUsers()
    session = Session(users=users)
    session.send(PROTOCOL_HEADER)
    session.send(start_ok())
    session.send_frame(0, TUNE_OK)
    pipelined = marshal(0, commands.Connection.Open(virtual_host="fresh")) + marshal(1, commands.Channel.Open())
    assert session.send(pipelined) == []  # connection.open held, channel.open behind it
    assert session.send(marshal(2, commands.Channel.Open())) == []  # more while held: kept behind it too
    users.vhosts["guest"].add("fresh")
    session.conn.recheck(0)
    assert _kinds(parse_output(session)) == ["OpenOk", "OpenOk", "OpenOk"]
    assert session.events[-2:] == [ChannelOpened(1), ChannelOpened(2)]


def test_a_vhost_still_refused_after_the_recheck_is_refused() -> None:
    session = Session(users=ClusterUsers())
    session.send(PROTOCOL_HEADER)
    session.send(start_ok())
    session.send_frame(0, TUNE_OK)
    assert session.send_frame(0, commands.Connection.Open(virtual_host="fresh")) == []
    session.conn.recheck(0)
    assert close_of(parse_output(session)) == (0, 530, "NOT_ALLOWED - access to vhost 'fresh' refused for user "
                                                      "'guest'", 10, 40)


def test_a_refusal_is_held_once_per_connection() -> None:
    """The login was rechecked: the vhost refusal that follows is final at once (the recheck came after both)."""
    users = ClusterUsers()
    session = Session(users=users)
    session.send(PROTOCOL_HEADER)
    session.send(start_ok(user="new", password="pw"))
    users.passwords["new"] = "pw"
    session.conn.recheck(0)
    parse_output(session)
    session.send_frame(0, TUNE_OK)
    out = session.send_frame(0, commands.Connection.Open(virtual_host="/"))
    assert close_of(out)[1] == 530


def test_without_the_hook_a_refusal_is_final_at_once() -> None:
    """A single node (its authenticator says a refusal is never stale, or has no such hook)."""
    session = Session()
    session.send(PROTOCOL_HEADER)
    assert close_of(session.send(start_ok(password="wrong"))) == (0, 403, REFUSED, 0, 0)
    assert not session.conn.awaiting_recheck


def parse_output(session: Session) -> list[tuple[int, object]]:
    """What the connection wrote since the last look (after a `recheck`), its events collected."""
    session.events += session.conn.next_events()
    return parse_frames(session.conn.data_to_send())
