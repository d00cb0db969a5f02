from sbxkit.cli import main

main()
