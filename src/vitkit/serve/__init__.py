"""`vitkit serve`: a local web page for looking inside a model, and a JSON prediction API.

- `service`: the model loaded once (`ModelService`): predict and explain on decoded inputs.
- `uploads`: multipart bodies read under a size limit and decoded, with 4xx errors.
- `batching`: concurrent requests run through the model together (`DynamicBatcher`).
- `app`: the FastAPI application (`create_app`): routes, errors, bearer token, the page.
- `command`: the `vitkit serve` verb. `figures` and `static/`: the page's figures and files.

Only `vitkit.cli` imports this package, and only when the verb runs (FastAPI loads then).
"""
