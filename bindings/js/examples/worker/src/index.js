// An idempotent `POST /orders` Worker on D1 (see ../README.md).
import { createOrdersWorker } from "./app.js";

export default createOrdersWorker();
