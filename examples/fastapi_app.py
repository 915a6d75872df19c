"""A FastAPI app on cadeloop: `cadeloop fastapi_app:app --app-dir examples`.

Shows lifespan state (made once at startup, seen by every request), a JSON
route, and a route with a path parameter and query parameters.
"""

from __future__ import annotations

import contextlib
from typing import AsyncIterator

from fastapi import FastAPI, Request
from pydantic import BaseModel


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, object]]:
    # Whatever is yielded here is copied into every request's scope["state"].
    yield {"greeting": "Hello", "started": True}


app = FastAPI(lifespan=lifespan)


class Item(BaseModel):
    name: str
    price: float
    tags: list[str] = []


@app.get("/")
async def root(request: Request) -> dict[str, object]:
    return {"message": f"{request.state.greeting}, World!"}


@app.get("/items/{item_id}")
async def read_item(item_id: int, q: str | None = None, limit: int = 10) -> dict[str, object]:
    return {"item_id": item_id, "q": q, "limit": limit}


@app.post("/items")
async def create_item(item: Item) -> dict[str, object]:
    return {"created": item.model_dump(), "total": item.price * 2}
