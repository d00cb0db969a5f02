from sbxkit.handoff.client import main  # `sbxkit run` handed to the supervisor, else the CLI

main()
