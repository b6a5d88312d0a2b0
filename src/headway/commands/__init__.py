"""One module per `headway` verb; cli.py only assembles them."""
