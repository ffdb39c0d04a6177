// Structural types of node:http (no @types/node needed).
export interface IncomingMessageLike {
  method?: string;
  url?: string;
  headers: Record<string, string | string[] | undefined>;
  rawHeaders: string[];
}
export interface ServerResponseLike {
  statusCode: number;
  setHeader(name: string, value: string | number | readonly string[]): unknown;
  getHeader(name: string): unknown;
  end(chunk?: unknown): unknown;
  write(chunk: unknown): boolean;
  writeHead(status: number, headers?: Record<string, string>): unknown;
}
