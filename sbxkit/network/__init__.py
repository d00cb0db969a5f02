"""Governed networking (docs/network.md): the allow-list proxy and the callback endpoint on a
``none`` sandbox's own loopback, and the reference's managed network."""
