// Start cost in workerd alone (no miniflare, no database): the baseline Worker.
export default {
  async fetch(request) {
    await request.arrayBuffer();
    return new Response('{"ok":true}', { status: 201, headers: { "content-type": "application/json" } });
  },
};
