"""The one lifecycle under every consumer: owners (in-process and supervised, with the supervisor's
client side), admission, the owned container, the one-shot payload on the daemon's and the kernel's
path, outcomes and output caps."""
