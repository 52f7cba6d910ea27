// The SDK's ndjson stream with a callback on every message in each direction: what the
// interop drivers (acp_client.mjs, acp_script.mjs) record of the wire.

export function tapped(raw, onIn, onOut) {
  return {
    readable: raw.readable.pipeThrough(
      new TransformStream({
        transform(msg, controller) {
          onIn(msg);
          controller.enqueue(msg);
        },
      }),
    ),
    writable: new WritableStream({
      async write(msg) {
        onOut(msg);
        const writer = raw.writable.getWriter();
        try {
          await writer.write(msg);
        } finally {
          writer.releaseLock();
        }
      },
      async close() {
        await raw.writable.close();
      },
    }),
  };
}
