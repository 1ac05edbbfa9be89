"""Discovery: membership from heartbeats, failure detection, the peer list."""

from nodes.discovery.membership import MembershipView, PeerStatus

__all__ = ["MembershipView", "PeerStatus"]
